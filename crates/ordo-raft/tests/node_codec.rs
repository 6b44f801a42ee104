//! The wire codec of `Message` and `Membership`: one test per reject case,
//! and a round-trip property over arbitrary valid messages.

use ordo_raft::{
    DecodeError, DecodeLimits, Entry, EntryKind, Membership, Message, Snapshot, SnapshotMeta, decode,
    decode_membership, encode, encode_membership,
};
use proptest::prelude::*;

fn limits() -> DecodeLimits {
    DecodeLimits { max_entries: 16, max_entry_bytes: 64, max_snapshot_bytes: 256, max_members: 8 }
}

fn bytes_of(msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode(msg, &mut out);
    out
}

fn entry(term: u64, index: u64) -> Entry {
    Entry { term, index, kind: EntryKind::Normal, data: vec![index as u8].into() }
}

fn append(prev_index: u64, prev_term: u64, entries: Vec<Entry>) -> Message {
    Message::AppendEntries {
        term: 5,
        from: 1,
        to: 2,
        prev_index,
        prev_term,
        entries: entries.into(),
        leader_commit: 3,
    }
}

fn snapshot(len: usize) -> Message {
    Message::InstallSnapshot {
        term: 5,
        from: 1,
        to: 2,
        snapshot: Snapshot {
            meta: SnapshotMeta { index: 9, term: 4, membership: Membership::with_voters([1, 2, 3]) },
            data: vec![7; len],
        },
    }
}

#[test]
fn every_kind_round_trips() {
    let msgs = vec![
        Message::PreVote { term: 3, from: 1, to: 2, last_log_index: 7, last_log_term: 2 },
        Message::PreVoteReply { term: 3, from: 2, to: 1, granted: true },
        Message::RequestVote { term: 3, from: 1, to: 2, last_log_index: 0, last_log_term: 0, transfer: true },
        Message::VoteReply { term: 3, from: 2, to: 1, granted: false },
        append(4, 2, vec![entry(3, 5), entry(5, 6)]),
        Message::AppendReply {
            term: 5,
            from: 2,
            to: 1,
            success: false,
            index: 4,
            hint_index: 2,
            hint_term: 1,
        },
        Message::AppendReply {
            term: 5,
            from: 2,
            to: 1,
            success: true,
            index: 6,
            hint_index: 0,
            hint_term: 0,
        },
        snapshot(10),
        Message::SnapshotReply { term: 5, from: 2, to: 1, index: 9 },
        Message::TimeoutNow { term: 5, from: 1, to: 2 },
    ];
    for msg in msgs {
        assert_eq!(decode(&bytes_of(&msg), &limits()), Ok(msg));
    }
}

#[test]
fn rejects_bad_magic_version_and_kind() {
    let mut b = bytes_of(&Message::TimeoutNow { term: 1, from: 1, to: 2 });
    b[0] = 0;
    assert_eq!(decode(&b, &limits()), Err(DecodeError::BadMagic(0)));
    let mut b = bytes_of(&Message::TimeoutNow { term: 1, from: 1, to: 2 });
    b[1] = 9;
    assert_eq!(decode(&b, &limits()), Err(DecodeError::UnsupportedVersion(9)));
    let mut b = bytes_of(&Message::TimeoutNow { term: 1, from: 1, to: 2 });
    b[2] = 200;
    assert_eq!(decode(&b, &limits()), Err(DecodeError::UnknownKind(200)));
    assert!(matches!(decode(&[], &limits()), Err(DecodeError::Truncated { .. })));
}

#[test]
fn rejects_every_truncation_and_trailing_bytes() {
    let msg = append(4, 2, vec![entry(3, 5), entry(5, 6)]);
    let b = bytes_of(&msg);
    for cut in 0..b.len() {
        assert!(matches!(decode(&b[..cut], &limits()), Err(DecodeError::Truncated { .. })), "cut {cut}");
    }
    let mut long = b.clone();
    long.push(0);
    assert_eq!(decode(&long, &limits()), Err(DecodeError::TrailingBytes(1)));
}

#[test]
fn rejects_counts_and_lengths_beyond_limits() {
    let many: Vec<Entry> = (5..5 + 17).map(|i| entry(3, i)).collect();
    assert!(matches!(
        decode(&bytes_of(&append(4, 2, many)), &limits()),
        Err(DecodeError::TooManyEntries { count: 17, max: 16 })
    ));
    let big = Entry { term: 3, index: 5, kind: EntryKind::Normal, data: vec![0; 65].into() };
    assert!(matches!(
        decode(&bytes_of(&append(4, 2, vec![big])), &limits()),
        Err(DecodeError::EntryTooLarge { len: 65, max: 64 })
    ));
    assert!(matches!(
        decode(&bytes_of(&snapshot(257)), &limits()),
        Err(DecodeError::SnapshotTooLarge { len: 257, max: 256 })
    ));
    let members = Membership::with_voters(1..=9);
    let mut b = Vec::new();
    encode_membership(&members, &mut b);
    assert!(matches!(decode_membership(&b, &limits()), Err(DecodeError::TooManyMembers { .. })));
}

#[test]
fn huge_declared_counts_fail_before_allocating() {
    // A count of u32::MAX entries in a tiny message: refused by the limit,
    // and with a huge limit refused as truncated (never allocated).
    let mut b = bytes_of(&append(4, 2, vec![]));
    let at = b.len() - 4;
    b[at..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode(&b, &limits()), Err(DecodeError::TooManyEntries { .. })));
    let unlimited = DecodeLimits {
        max_entries: usize::MAX,
        max_entry_bytes: u64::MAX,
        max_snapshot_bytes: u64::MAX,
        max_members: usize::MAX,
    };
    assert!(matches!(decode(&b, &unlimited), Err(DecodeError::Truncated { .. })));
    // A snapshot claiming u64::MAX bytes.
    let mut b = bytes_of(&snapshot(0));
    let at = b.len() - 8;
    b[at..].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(decode(&b, &unlimited), Err(DecodeError::Truncated { .. })));
    // An entry claiming 2^63 bytes of data: its length is the last varint.
    let mut b = bytes_of(&append(
        4,
        2,
        vec![Entry { term: 3, index: 5, kind: EntryKind::Noop, data: vec![].into() }],
    ));
    b.pop();
    b.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    assert!(matches!(decode(&b, &unlimited), Err(DecodeError::Truncated { .. })));
}

/// Varints are read in their shortest form only (so that every message
/// decoded encodes back to its bytes) and never beyond 64 bits.
#[test]
fn rejects_malformed_varints() {
    let noop = |data_len: Vec<u8>| {
        let mut b = bytes_of(&append(
            4,
            2,
            vec![Entry { term: 3, index: 5, kind: EntryKind::Noop, data: vec![].into() }],
        ));
        b.pop(); // the length, 0
        b.extend_from_slice(&data_len);
        b
    };
    let unlimited = DecodeLimits { max_entry_bytes: u64::MAX, ..limits() };
    assert!(decode(&noop(vec![0]), &unlimited).is_ok(), "the shortest zero");
    assert_eq!(
        decode(&noop(vec![0x80, 0x00]), &unlimited),
        Err(DecodeError::BadVarint),
        "a zero in two bytes"
    );
    assert_eq!(decode(&noop(vec![0x81, 0x00]), &unlimited), Err(DecodeError::BadVarint), "a trailing zero");
    let mut beyond = vec![0xFF; 9];
    beyond.push(0x02);
    assert_eq!(decode(&noop(beyond), &unlimited), Err(DecodeError::BadVarint), "65 bits");
    assert_eq!(decode(&noop(vec![0xFF; 11]), &unlimited), Err(DecodeError::BadVarint), "eleven bytes");
    // The term's step is a varint too: one overflowing the term is refused.
    let mut b = bytes_of(&append(4, 2, vec![entry(3, 5)]));
    let step_at = b.len() - 3;
    assert_eq!(b[step_at], 1, "the step from prev_term 2 to term 3");
    let mut huge = vec![0xFF; 9];
    huge.push(0x01);
    b.splice(step_at..step_at + 1, huge);
    assert_eq!(decode(&b, &limits()), Err(DecodeError::TermOverflow { index: 5 }));
}

/// Version 2 leaves out each entry's index and term (contiguous, steps
/// from `prev_term`): an entry of a small command costs 3 bytes besides
/// its data.
#[test]
fn an_entry_costs_three_bytes_besides_its_data() {
    let empty = bytes_of(&append(4, 2, vec![])).len();
    let entries: Vec<Entry> =
        (5..5 + 16).map(|i| Entry { data: vec![0; 25].into(), ..entry(3, i) }).collect();
    assert_eq!(bytes_of(&append(4, 2, entries)).len(), empty + 16 * (3 + 25));
}

/// Gaps and terms going down cannot be written in version 2 (indexes are
/// implicit, terms go up in steps): such a message is refused in process
/// by `validate`, and the encoder refuses to write it. What the wire can
/// still say wrongly — a term above the message's, an index past `u64` —
/// the decoder refuses.
#[test]
fn rejects_non_contiguous_entries_and_term_disorder() {
    let gap = append(4, 2, vec![entry(3, 5), entry(3, 7)]);
    assert_eq!(gap.validate(&limits()), Err(DecodeError::NonContiguousEntries { expected: 6, found: 7 }));
    let wrong_start = append(4, 2, vec![entry(3, 4)]);
    assert!(matches!(wrong_start.validate(&limits()), Err(DecodeError::NonContiguousEntries { .. })));
    let decreasing = append(4, 2, vec![entry(4, 5), entry(3, 6)]);
    assert!(matches!(decreasing.validate(&limits()), Err(DecodeError::EntryTermOutOfOrder { .. })));
    let below_prev = append(4, 3, vec![entry(2, 5)]);
    assert!(matches!(below_prev.validate(&limits()), Err(DecodeError::EntryTermOutOfOrder { .. })));
    for unwritable in [gap, wrong_start, decreasing, below_prev] {
        let encoded = std::panic::catch_unwind(|| bytes_of(&unwritable));
        assert!(encoded.is_err(), "encoded {unwritable:?}");
    }
    let above_message = append(4, 2, vec![entry(6, 5)]);
    assert!(matches!(
        decode(&bytes_of(&above_message), &limits()),
        Err(DecodeError::EntryTermOutOfOrder { .. })
    ));
    // prev_index u64::MAX with one entry: no index left for it.
    let mut overflow = bytes_of(&append(u64::MAX, 2, vec![]));
    let count_at = overflow.len() - 4;
    overflow[count_at..].copy_from_slice(&1u32.to_le_bytes());
    overflow.extend_from_slice(&[0, 1, 1, 7]); // normal, step 1, one byte
    assert_eq!(decode(&overflow, &limits()), Err(DecodeError::IndexOverflow));
}

#[test]
fn rejects_inconsistent_positions_ids_hints_and_snapshot_meta() {
    // prev_index 0 with a non-zero term; prev_term above the message term.
    assert!(matches!(
        decode(&bytes_of(&append(0, 1, vec![])), &limits()),
        Err(DecodeError::InvalidLogPosition { .. })
    ));
    assert!(matches!(
        decode(&bytes_of(&append(3, 9, vec![])), &limits()),
        Err(DecodeError::InvalidLogPosition { .. })
    ));
    let vote = Message::RequestVote {
        term: 2,
        from: 1,
        to: 2,
        last_log_index: 5,
        last_log_term: 3,
        transfer: false,
    };
    assert!(matches!(decode(&bytes_of(&vote), &limits()), Err(DecodeError::InvalidLogPosition { .. })));
    for (from, to) in [(0, 2), (1, 0), (3, 3)] {
        let m = Message::TimeoutNow { term: 1, from, to };
        assert_eq!(decode(&bytes_of(&m), &limits()), Err(DecodeError::InvalidNodeId { from, to }));
    }
    let hint = Message::AppendReply {
        term: 5,
        from: 2,
        to: 1,
        success: false,
        index: 4,
        hint_index: 5,
        hint_term: 1,
    };
    assert!(matches!(decode(&bytes_of(&hint), &limits()), Err(DecodeError::InvalidHint { .. })));
    let hint_on_success = Message::AppendReply {
        term: 5,
        from: 2,
        to: 1,
        success: true,
        index: 4,
        hint_index: 1,
        hint_term: 1,
    };
    assert!(matches!(decode(&bytes_of(&hint_on_success), &limits()), Err(DecodeError::InvalidHint { .. })));
    let mut s = snapshot(1);
    if let Message::InstallSnapshot { snapshot, .. } = &mut s {
        snapshot.meta.term = 6;
    }
    assert!(matches!(decode(&bytes_of(&s), &limits()), Err(DecodeError::InvalidSnapshotMeta { .. })));
    let mut s = snapshot(1);
    if let Message::InstallSnapshot { snapshot, .. } = &mut s {
        snapshot.meta.index = 0;
    }
    assert!(matches!(decode(&bytes_of(&s), &limits()), Err(DecodeError::InvalidSnapshotMeta { .. })));
}

#[test]
fn rejects_bad_bools_and_entry_kinds() {
    let mut b = bytes_of(&Message::VoteReply { term: 1, from: 1, to: 2, granted: true });
    *b.last_mut().unwrap() = 2;
    assert_eq!(decode(&b, &limits()), Err(DecodeError::InvalidBool(2)));
    let mut b = bytes_of(&append(
        4,
        2,
        vec![Entry { term: 3, index: 5, kind: EntryKind::Noop, data: vec![].into() }],
    ));
    let kind_at = b.len() - 3; // kind, step, length (0)
    b[kind_at] = 9;
    assert_eq!(decode(&b, &limits()), Err(DecodeError::UnknownEntryKind(9)));
}

#[test]
fn rejects_malformed_memberships() {
    let mut m = Membership::with_voters([1, 2]);
    m.learners.insert(2);
    let mut b = Vec::new();
    encode_membership(&m, &mut b);
    assert!(matches!(decode_membership(&b, &limits()), Err(DecodeError::InvalidMembership(_))));
    // Ids not ascending (hand-made: 2 voters, 5 then 3).
    let mut b = Vec::new();
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(&3u64.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    assert!(matches!(decode_membership(&b, &limits()), Err(DecodeError::InvalidMembership(_))));
    // Id 0.
    let mut b = Vec::new();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    assert!(matches!(decode_membership(&b, &limits()), Err(DecodeError::InvalidMembership(_))));
    // A Membership entry whose data is not a membership.
    let bad =
        append(4, 2, vec![Entry { term: 3, index: 5, kind: EntryKind::Membership, data: vec![1].into() }]);
    assert!(matches!(decode(&bytes_of(&bad), &limits()), Err(DecodeError::Truncated { .. })));
    // And a good one round-trips.
    let good = Membership { voters: [1, 2, 3].into(), learners: [7].into() };
    let mut b = Vec::new();
    encode_membership(&good, &mut b);
    assert_eq!(decode_membership(&b, &limits()), Ok(good));
}

fn arb_membership() -> impl Strategy<Value = Membership> {
    (proptest::collection::btree_set(1u64..20, 0..4), proptest::collection::btree_set(20u64..40, 0..4))
        .prop_map(|(voters, learners)| Membership { voters, learners })
}

fn arb_entries() -> impl Strategy<Value = (u64, u64, Vec<Entry>)> {
    (
        0u64..1000,
        proptest::collection::vec((0u64..2, 0u8..3, proptest::collection::vec(any::<u8>(), 0..16)), 0..8),
    )
        .prop_flat_map(|(prev_index, raw)| {
            arb_membership().prop_map(move |m| {
                let prev_term = if prev_index == 0 { 0 } else { 1 };
                let mut term = prev_term.max(1);
                let entries = raw
                    .iter()
                    .enumerate()
                    .map(|(k, (bump, kind, data))| {
                        term += bump;
                        let (kind, data) = match kind {
                            0 => (EntryKind::Normal, data.clone()),
                            1 => (EntryKind::Noop, Vec::new()),
                            _ => {
                                let mut b = Vec::new();
                                encode_membership(&m, &mut b);
                                (EntryKind::Membership, b)
                            }
                        };
                        Entry { term, index: prev_index + 1 + k as u64, kind, data: data.into() }
                    })
                    .collect();
                (prev_index, prev_term, entries)
            })
        })
}

fn arb_message() -> impl Strategy<Value = Message> {
    let ids = (1u64..10, 10u64..20);
    prop_oneof![
        (ids.clone(), 1u64..100, 0u64..100).prop_map(|((from, to), term, i)| Message::PreVote {
            term,
            from,
            to,
            last_log_index: i,
            last_log_term: if i == 0 { 0 } else { term }
        }),
        (ids.clone(), 0u64..100, any::<bool>())
            .prop_map(|((from, to), term, granted)| Message::PreVoteReply { term, from, to, granted }),
        (ids.clone(), 1u64..100, 0u64..100, any::<bool>()).prop_map(|((from, to), term, i, transfer)| {
            Message::RequestVote {
                term,
                from,
                to,
                last_log_index: i,
                last_log_term: if i == 0 { 0 } else { 1 },
                transfer,
            }
        }),
        (ids.clone(), 0u64..100, any::<bool>()).prop_map(|((from, to), term, granted)| Message::VoteReply {
            term,
            from,
            to,
            granted
        }),
        (ids.clone(), arb_entries(), any::<u64>()).prop_map(
            |((from, to), (prev_index, prev_term, entries), c)| {
                Message::AppendEntries {
                    term: 50,
                    from,
                    to,
                    prev_index,
                    prev_term,
                    entries: entries.into(),
                    leader_commit: c,
                }
            }
        ),
        (ids.clone(), 1u64..100, any::<bool>(), 0u64..1000, 0u64..1000).prop_map(
            |((from, to), term, success, index, h)| {
                let (hint_index, hint_term) =
                    if success { (0, 0) } else { (h.min(index), u64::from(h.min(index) > 0)) };
                Message::AppendReply { term, from, to, success, index, hint_index, hint_term }
            }
        ),
        (ids.clone(), 1u64..100, 1u64..1000, arb_membership(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|((from, to), term, index, membership, data)| Message::InstallSnapshot {
                term,
                from,
                to,
                snapshot: Snapshot { meta: SnapshotMeta { index, term, membership }, data },
            }),
        (ids.clone(), any::<u64>(), any::<u64>())
            .prop_map(|((from, to), term, index)| Message::SnapshotReply { term, from, to, index }),
        (ids, any::<u64>()).prop_map(|((from, to), term)| Message::TimeoutNow { term, from, to }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn valid_messages_round_trip(msg in arb_message()) {
        prop_assert_eq!(msg.validate(&limits()), Ok(()));
        let b = bytes_of(&msg);
        prop_assert_eq!(decode(&b, &limits()), Ok(msg));
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_ok_results_round_trip(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(msg) = decode(&b, &limits()) {
            prop_assert_eq!(bytes_of(&msg), b);
        }
    }

    #[test]
    fn mutated_valid_messages_never_panic(msg in arb_message(), at in any::<usize>(), byte in any::<u8>()) {
        let mut b = bytes_of(&msg);
        let i = at % b.len();
        b[i] = byte;
        if let Ok(decoded) = decode(&b, &limits()) {
            prop_assert_eq!(bytes_of(&decoded), b);
        }
    }
}

#[test]
fn an_appends_entries_share_one_buffer_of_exactly_their_data() {
    let mut entries: Vec<Entry> = (1..=3).map(|i| entry(5, 4 + i)).collect();
    entries[1].data = b"a longer entry".to_vec().into();
    entries[2].kind = EntryKind::Noop;
    entries[2].data = Default::default();
    let msg = append(4, 5, entries.clone());
    let bytes = bytes_of(&msg);
    let back = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(back, msg);
    let Message::AppendEntries { entries: got, .. } = back else { unreachable!() };
    // Laid end to end in one buffer, none of it pointing into the input.
    let (a, b) = (&got[0].data, &got[1].data);
    assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr(), "contiguous");
    let input = bytes.as_ptr_range();
    assert!(!input.contains(&a.as_ptr()) && !input.contains(&b.as_ptr()), "copied out of the datagram");
    assert!(got[2].data.is_empty());
}
