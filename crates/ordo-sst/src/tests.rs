use super::*;
use ordo_fabric::loopback::{Loopback, loopback_group};
use proptest::prelude::*;

struct Cols {
    received: CounterCol,
    delivered: CounterCol,
    wedged: FlagCol,
    slots: CounterArrayCol,
    acks: ListCol,
}

fn layout() -> (SstLayout, Cols) {
    let mut b = LayoutBuilder::new();
    let received = b.counter("received_num");
    let delivered = b.counter("delivered_num");
    let wedged = b.flag("wedged");
    b.align_to_cache_line();
    let slots = b.counters("slot_counters", 5);
    let acks = b.list("acks", 4);
    (b.build(), Cols { received, delivered, wedged, slots, acks })
}

fn tables(n: usize) -> (Vec<Loopback>, Vec<Sst>, Cols) {
    let (l, cols) = layout();
    let fabrics = loopback_group(n, 128 + l.table_len(n));
    let members: Vec<MemberId> = (0..n as MemberId).collect();
    let ssts = fabrics
        .iter()
        .map(|f| Sst::new(f.region().clone(), 128, l.clone(), &members, f.member()).unwrap())
        .collect();
    (fabrics, ssts, cols)
}

#[test]
fn layout_places_columns_in_order_and_rows_on_cache_lines() {
    let (l, c) = layout();
    assert_eq!(ColumnRange::from(c.received), ColumnRange { offset: 0, len: 8 });
    assert_eq!(ColumnRange::from(c.delivered), ColumnRange { offset: 8, len: 8 });
    assert_eq!(ColumnRange::from(c.wedged), ColumnRange { offset: 16, len: 8 });
    assert_eq!(ColumnRange::from(c.slots), ColumnRange { offset: 64, len: 40 });
    assert_eq!(c.acks.header(), ColumnRange { offset: 104, len: 16 });
    assert_eq!(c.acks.items(), ColumnRange { offset: 120, len: 32 });
    assert_eq!(l.row_stride(), 192);
    assert!(l.diagram().contains("received_num"));
}

#[test]
fn counters_start_at_minus_one_everywhere_without_initialisation() {
    let (_f, s, c) = tables(3);
    for sst in &s {
        for row in 0..3 {
            assert_eq!(sst.counter(row, c.received), -1);
            assert_eq!(sst.counter_at(row, c.slots, 4), -1);
            assert!(!sst.flag(row, c.wedged));
        }
    }
}

#[test]
fn a_push_updates_only_the_pushed_range_of_the_owner_row_at_peers() {
    let (mut f, s, c) = tables(3);
    s[1].set_counter(c.received, 25);
    s[1].set_counter(c.delivered, 21);
    s[1].push(&mut f[1], c.received, None).unwrap();
    for peer in [0, 2] {
        assert_eq!(s[peer].counter(1, c.received), 25);
        assert_eq!(s[peer].counter(1, c.delivered), -1, "delivered was not pushed");
        assert_eq!(s[peer].counter(0, c.received), -1, "other rows untouched");
    }
    s[1].push(&mut f[1], ColumnRange::from(c.received).union(c.delivered.into()), Some(&[2])).unwrap();
    assert_eq!(s[2].counter(1, c.delivered), 21);
    assert_eq!(s[0].counter(1, c.delivered), -1, "member 0 was not chosen");
    assert_eq!(s[0].min_counter(c.received, 0..3), Some(-1));
}

#[test]
#[should_panic(expected = "monotonic")]
fn a_decreasing_counter_is_a_bug() {
    let (_f, s, c) = tables(1);
    s[0].set_counter(c.received, 5);
    s[0].set_counter(c.received, 4);
}

#[test]
fn bad_tables_are_refused() {
    let (l, _) = layout();
    let r = Region::new_heap(256);
    assert_eq!(Sst::new(r.clone(), 8, l.clone(), &[0], 0).unwrap_err(), SstError::Misaligned(8));
    assert!(matches!(Sst::new(r.clone(), 0, l.clone(), &[0, 1], 0), Err(SstError::DoesNotFit { .. })));
    assert!(matches!(Sst::new(r.clone(), 0, l.clone(), &[1], 0), Err(SstError::BadMembers(_))));
    assert!(matches!(Sst::new(r, 0, l, &[0, 0], 0), Err(SstError::BadMembers(_))));
}

#[test]
fn list_append_truncate_and_push_order() {
    let (mut f, mut s, c) = tables(2);
    let mut out = Vec::new();
    s[0].list_append(c.acks, &[10, 11, 12]).unwrap();
    assert_eq!(s[0].push_list(&mut f[0], c.acks, None).unwrap(), 3, "truncated word, items, header");
    assert_eq!(s[1].list(0, c.acks, &mut out), Ok(0));
    assert_eq!(out, vec![10, 11, 12]);
    assert_eq!(s[0].list_append(c.acks, &[13, 14]).unwrap_err(), ListFull { live: 3, cap: 4, adding: 2 });
    s[0].list_truncate(c.acks, 2);
    s[0].list_append(c.acks, &[13, 14]).unwrap();
    assert_eq!(s[0].push_list(&mut f[0], c.acks, None).unwrap(), 3, "truncated word, items, header");
    assert_eq!(s[1].list(0, c.acks, &mut out), Ok(2));
    assert_eq!(out, vec![12, 13, 14]);
}

proptest! {
    /// Whatever the interleaving of appends, truncations and pushes, a reader
    /// sees exactly the owner's live items as of the last push.
    #[test]
    fn list_reader_sees_the_owner_list_as_of_the_last_push(ops in prop::collection::vec((0u8..3, 1usize..4), 1..60)) {
        let (mut f, mut s, c) = tables(2);
        let mut model: std::collections::VecDeque<(u64, u64)> = Default::default();
        let (mut next, mut first) = (0u64, 0u64);
        let mut pushed: (u64, Vec<u64>) = (0, vec![]);
        let mut out = Vec::new();
        for (op, n) in ops {
            match op {
                0 => {
                    let items: Vec<u64> = (0..n as u64).map(|k| 1000 + next + k).collect();
                    if s[0].list_append(c.acks, &items).is_ok() {
                        for it in items { model.push_back((next, it)); next += 1; }
                    }
                }
                1 => {
                    let upto = (first + n as u64).min(next);
                    s[0].list_truncate(c.acks, upto);
                    while model.front().is_some_and(|(i, _)| *i < upto) { model.pop_front(); }
                    first = upto;
                }
                _ => {
                    s[0].push_list(&mut f[0], c.acks, None).unwrap();
                    pushed = (first, model.iter().map(|(_, v)| *v).collect());
                }
            }
            let start = s[1].list(0, c.acks, &mut out).unwrap();
            prop_assert_eq!((start, out.clone()), pushed.clone());
        }
    }
}

/// The push order matters between writes, so apply a list push one write at
/// a time and read after each: the reader must never see an item that is
/// not the owner's item at that index (review finding: a header-first push
/// published `appended` before the items).
#[test]
fn a_reader_between_the_writes_of_a_list_push_never_sees_a_wrong_item() {
    let (l, c) = layout();
    let regions = [Region::new_heap(128 + l.table_len(2)), Region::new_heap(128 + l.table_len(2))];
    let owner = Sst::new(regions[0].clone(), 128, l.clone(), &[0, 1], 0).unwrap();
    let reader = Sst::new(regions[1].clone(), 128, l, &[0, 1], 1).unwrap();
    let apply = |(offset, len): (usize, usize)| {
        let mut buf = vec![0u8; len];
        regions[0].read_bytes(offset, &mut buf);
        regions[1].write_bytes(offset, &buf);
    };
    let mut truth: Vec<u64> = Vec::new(); // item value at each index
    let mut out = Vec::new();
    for round in 0..6u64 {
        let items: Vec<u64> = (0..3).map(|k| 100 * round + k).collect();
        if round > 0 {
            owner.list_truncate(c.acks, 3 * round);
        }
        owner.list_append(c.acks, &items).unwrap();
        truth.extend(&items);
        let writes = [
            owner.range(ColumnRange { offset: c.acks.header().offset + 8, len: 8 }),
            owner.range(c.acks.items()),
            owner.range(c.acks.header()),
        ];
        for w in writes {
            apply(w);
            let first = reader.list(0, c.acks, &mut out).unwrap();
            for (k, v) in out.iter().enumerate() {
                assert_eq!(
                    *v,
                    truth[first as usize + k],
                    "round {round}: index {} wrong",
                    first as usize + k
                );
            }
        }
    }
}

#[test]
fn impossible_list_headers_and_counters_from_a_peer_do_not_panic() {
    let (_f, s, c) = tables(2);
    let r = s[1].region().clone();
    let (h, _) = s[0].range(c.acks.header());
    r.store_release(h, u64::MAX); // appended
    let mut out = Vec::new();
    assert!(matches!(s[1].list(0, c.acks, &mut out), Err(SstError::BadList { .. })));
    assert!(out.is_empty());
    let (w, _) = s[0].range(c.received);
    r.store_release(w, 0x8000_0000_0000_0000);
    let _ = s[1].counter(0, c.received); // any value, no panic
}
