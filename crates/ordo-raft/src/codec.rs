//! The binary wire format of [`Message`] and of [`Membership`].
//!
//! Layout (all integers little-endian, no padding):
//!
//! ```text
//! message   := MAGIC:u8 VERSION:u8 kind:u8 term:u64 from:u64 to:u64 body
//! PreVote / RequestVote  := last_log_index:u64 last_log_term:u64 [transfer:bool (RequestVote only)]
//! PreVoteReply / VoteReply := granted:bool
//! AppendEntries := prev_index:u64 prev_term:u64 leader_commit:u64 count:u32 entry*count
//! entry     := kind:u8 term_step:varint len:varint data:[u8; len]
//! AppendReply := success:bool index:u64 hint_index:u64 hint_term:u64
//! InstallSnapshot := index:u64 snap_term:u64 membership len:u64 data:[u8; len]
//! SnapshotReply := index:u64
//! TimeoutNow := (empty)
//! membership := n_voters:u32 id:u64*n_voters n_learners:u32 id:u64*n_learners
//! bool      := 0 | 1
//! varint    := LEB128 of a u64, shortest form (at most 10 bytes)
//! ```
//!
//! An append's entries are contiguous after `prev_index` with terms that
//! never go down from `prev_term` (Raft's Log Matching), so the wire leaves
//! out what follows: entry `k`'s index is `prev_index + 1 + k`, and its
//! term is the previous entry's (for the first, `prev_term`) plus
//! `term_step`. An entry of a small command costs 3 bytes besides its data
//! (21 in version 1, with both as `u64`s): fewer bytes to seal, copy and
//! verify on the leader's hot path. Encoding an append whose entries break
//! that rule is a caller bug (it panics); `Message::validate` refuses such
//! a message in process.
//!
//! Decoding is total: any byte string yields either a message that passes
//! [`Message::validate`] or a typed [`DecodeError`]; it never panics. Every
//! count and length is checked against the [`DecodeLimits`] *and* against
//! the bytes remaining *before* anything is allocated, so a decode never
//! allocates more than the input's size (bounded by the limits). Trailing
//! bytes are an error. `encode` followed by `decode` is the identity on
//! every valid message (a property test checks it).

use crate::message::Message;
use crate::types::{Entry, EntryKind, Membership, NodeId, Snapshot, SnapshotMeta};
use bytes::{Bytes, BytesMut};
use std::collections::BTreeSet;

/// First byte of every encoded message.
pub const MAGIC: u8 = 0xA7;
/// Second byte: the wire format version (2: entries as in the module
/// docs; 1 carried each entry's index and term in full).
pub const VERSION: u8 = 2;

const HEADER_BYTES: usize = 3 + 3 * 8;
/// The least an entry takes on the wire: kind, a one-byte step, a one-byte
/// length.
const ENTRY_HEADER_BYTES: usize = 3;

const KIND_PRE_VOTE: u8 = 1;
const KIND_PRE_VOTE_REPLY: u8 = 2;
const KIND_REQUEST_VOTE: u8 = 3;
const KIND_VOTE_REPLY: u8 = 4;
const KIND_APPEND_ENTRIES: u8 = 5;
const KIND_APPEND_REPLY: u8 = 6;
const KIND_INSTALL_SNAPSHOT: u8 = 7;
const KIND_SNAPSHOT_REPLY: u8 = 8;
const KIND_TIMEOUT_NOW: u8 = 9;

const ENTRY_NORMAL: u8 = 0;
const ENTRY_NOOP: u8 = 1;
const ENTRY_MEMBERSHIP: u8 = 2;

/// Bounds a decoder enforces on peer-supplied sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Most entries in one AppendEntries.
    pub max_entries: usize,
    /// Most bytes of data in one entry.
    pub max_entry_bytes: u64,
    /// Most bytes of application data in one InstallSnapshot.
    pub max_snapshot_bytes: u64,
    /// Most voters + learners in one membership.
    pub max_members: usize,
}

impl Default for DecodeLimits {
    fn default() -> DecodeLimits {
        DecodeLimits {
            max_entries: 4096,
            max_entry_bytes: 1 << 20,
            max_snapshot_bytes: 1 << 30,
            max_members: 64,
        }
    }
}

impl DecodeLimits {
    /// Limits that accept everything the node `config` may send (its batch
    /// and entry size) with the given snapshot and membership bounds.
    pub fn for_config(config: &crate::Config, max_snapshot_bytes: u64, max_members: usize) -> DecodeLimits {
        DecodeLimits {
            max_entries: config.max_entries_per_append,
            max_entry_bytes: config.max_entry_bytes,
            max_snapshot_bytes,
            max_members,
        }
    }
}

/// Why bytes were not a valid message (or membership).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("bad magic byte {0:#04x}")]
    BadMagic(u8),
    #[error("unsupported wire version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("unknown entry kind {0}")]
    UnknownEntryKind(u8),
    #[error("truncated: needed {needed} bytes, {remaining} remain")]
    Truncated { needed: u64, remaining: u64 },
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
    #[error("malformed varint (longer than its shortest form, or beyond 64 bits)")]
    BadVarint,
    #[error("invalid boolean byte {0}")]
    InvalidBool(u8),
    #[error("invalid node ids from={from} to={to}")]
    InvalidNodeId { from: NodeId, to: NodeId },
    #[error("invalid log position {field}: index {index} term {term}")]
    InvalidLogPosition { field: &'static str, index: u64, term: u64 },
    #[error("{count} entries exceed the limit {max}")]
    TooManyEntries { count: u64, max: usize },
    #[error("entry of {len} bytes exceeds the limit {max}")]
    EntryTooLarge { len: u64, max: u64 },
    #[error("snapshot of {len} bytes exceeds the limit {max}")]
    SnapshotTooLarge { len: u64, max: u64 },
    #[error("{count} members exceed the limit {max}")]
    TooManyMembers { count: u64, max: usize },
    #[error("entries not contiguous: expected index {expected}, found {found}")]
    NonContiguousEntries { expected: u64, found: u64 },
    #[error("entry {index} has term {term} out of order")]
    EntryTermOutOfOrder { index: u64, term: u64 },
    #[error("index overflow")]
    IndexOverflow,
    #[error("entry {index}'s term step overflows the term")]
    TermOverflow { index: u64 },
    #[error("invalid reject hint: index {index} hint {hint_index}")]
    InvalidHint { index: u64, hint_index: u64 },
    #[error("invalid snapshot metadata: index {index} term {term}")]
    InvalidSnapshotMeta { index: u64, term: u64 },
    #[error("invalid membership: {0}")]
    InvalidMembership(&'static str),
}

/// Appends the encoding of `msg` to `out`.
pub fn encode(msg: &Message, out: &mut Vec<u8>) {
    let kind = match msg {
        Message::PreVote { .. } => KIND_PRE_VOTE,
        Message::PreVoteReply { .. } => KIND_PRE_VOTE_REPLY,
        Message::RequestVote { .. } => KIND_REQUEST_VOTE,
        Message::VoteReply { .. } => KIND_VOTE_REPLY,
        Message::AppendEntries { .. } => KIND_APPEND_ENTRIES,
        Message::AppendReply { .. } => KIND_APPEND_REPLY,
        Message::InstallSnapshot { .. } => KIND_INSTALL_SNAPSHOT,
        Message::SnapshotReply { .. } => KIND_SNAPSHOT_REPLY,
        Message::TimeoutNow { .. } => KIND_TIMEOUT_NOW,
    };
    out.extend_from_slice(&[MAGIC, VERSION, kind]);
    put_u64(out, msg.term());
    put_u64(out, msg.from());
    put_u64(out, msg.to());
    match msg {
        Message::PreVote { last_log_index, last_log_term, .. } => {
            put_u64(out, *last_log_index);
            put_u64(out, *last_log_term);
        }
        Message::RequestVote { last_log_index, last_log_term, transfer, .. } => {
            put_u64(out, *last_log_index);
            put_u64(out, *last_log_term);
            out.push(u8::from(*transfer));
        }
        Message::PreVoteReply { granted, .. } | Message::VoteReply { granted, .. } => {
            out.push(u8::from(*granted));
        }
        Message::AppendEntries { prev_index, prev_term, entries, leader_commit, .. } => {
            put_u64(out, *prev_index);
            put_u64(out, *prev_term);
            put_u64(out, *leader_commit);
            put_u32(out, len_u32(entries.len()));
            let mut term = *prev_term;
            for (k, entry) in entries.iter().enumerate() {
                assert_eq!(
                    Some(entry.index),
                    prev_index.checked_add(1 + k as u64),
                    "encode: an append's entries follow prev_index without a gap"
                );
                assert!(entry.term >= term, "encode: an append's terms never go down");
                out.push(match entry.kind {
                    EntryKind::Normal => ENTRY_NORMAL,
                    EntryKind::Noop => ENTRY_NOOP,
                    EntryKind::Membership => ENTRY_MEMBERSHIP,
                });
                put_varint(out, entry.term - term);
                term = entry.term;
                put_varint(out, entry.data.len() as u64);
                out.extend_from_slice(&entry.data);
            }
        }
        Message::AppendReply { success, index, hint_index, hint_term, .. } => {
            out.push(u8::from(*success));
            put_u64(out, *index);
            put_u64(out, *hint_index);
            put_u64(out, *hint_term);
        }
        Message::InstallSnapshot { snapshot, .. } => {
            put_u64(out, snapshot.meta.index);
            put_u64(out, snapshot.meta.term);
            encode_membership(&snapshot.meta.membership, out);
            put_u64(out, snapshot.data.len() as u64);
            out.extend_from_slice(&snapshot.data);
        }
        Message::SnapshotReply { index, .. } => put_u64(out, *index),
        Message::TimeoutNow { .. } => {}
    }
}

/// Decodes exactly one message from `bytes` (see the module docs). The
/// data of an append's entries are copied into one buffer of exactly their
/// size, which the entries share: one allocation per append, however many
/// entries it carries.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Message, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    if bytes.len() < HEADER_BYTES {
        // Report the first bad byte we can see before saying "truncated".
        if let Some(&m) = bytes.first()
            && m != MAGIC
        {
            return Err(DecodeError::BadMagic(m));
        }
    }
    let magic = r.u8()?;
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let kind = r.u8()?;
    let term = r.u64()?;
    let from = r.u64()?;
    let to = r.u64()?;
    let msg = match kind {
        KIND_PRE_VOTE => {
            Message::PreVote { term, from, to, last_log_index: r.u64()?, last_log_term: r.u64()? }
        }
        KIND_REQUEST_VOTE => Message::RequestVote {
            term,
            from,
            to,
            last_log_index: r.u64()?,
            last_log_term: r.u64()?,
            transfer: r.bool()?,
        },
        KIND_PRE_VOTE_REPLY => Message::PreVoteReply { term, from, to, granted: r.bool()? },
        KIND_VOTE_REPLY => Message::VoteReply { term, from, to, granted: r.bool()? },
        KIND_APPEND_ENTRIES => {
            let prev_index = r.u64()?;
            let prev_term = r.u64()?;
            let leader_commit = r.u64()?;
            let count = r.u32()? as u64;
            if count > limits.max_entries as u64 {
                return Err(DecodeError::TooManyEntries { count, max: limits.max_entries });
            }
            // Each entry takes at least ENTRY_HEADER_BYTES: refuse a count
            // the input cannot hold before reserving space for it.
            r.need(count.saturating_mul(ENTRY_HEADER_BYTES as u64))?;
            let mut entries = Vec::with_capacity(count as usize);
            let mut ranges = Vec::with_capacity(count as usize);
            let mut entry_term = prev_term;
            for k in 0..count {
                let index = prev_index.checked_add(1 + k).ok_or(DecodeError::IndexOverflow)?;
                let kind = match r.u8()? {
                    ENTRY_NORMAL => EntryKind::Normal,
                    ENTRY_NOOP => EntryKind::Noop,
                    ENTRY_MEMBERSHIP => EntryKind::Membership,
                    other => return Err(DecodeError::UnknownEntryKind(other)),
                };
                let step = r.varint()?;
                entry_term = entry_term.checked_add(step).ok_or(DecodeError::TermOverflow { index })?;
                let term = entry_term;
                let len = r.varint()?;
                if len > limits.max_entry_bytes {
                    return Err(DecodeError::EntryTooLarge { len, max: limits.max_entry_bytes });
                }
                let start = r.pos;
                ranges.push(start..start + r.bytes(len)?.len());
                entries.push(Entry { term, index, kind, data: Bytes::new() });
            }
            // Every length is now known to lie within `bytes`.
            let mut all = BytesMut::with_capacity(ranges.iter().map(|x| x.len()).sum());
            for range in &ranges {
                all.extend_from_slice(&bytes[range.clone()]);
            }
            let all = all.freeze();
            let mut at = 0;
            for (entry, range) in entries.iter_mut().zip(ranges) {
                entry.data = all.slice(at..at + range.len());
                at += range.len();
            }
            Message::AppendEntries {
                term,
                from,
                to,
                prev_index,
                prev_term,
                entries: entries.into(),
                leader_commit,
            }
        }
        KIND_APPEND_REPLY => Message::AppendReply {
            term,
            from,
            to,
            success: r.bool()?,
            index: r.u64()?,
            hint_index: r.u64()?,
            hint_term: r.u64()?,
        },
        KIND_INSTALL_SNAPSHOT => {
            let index = r.u64()?;
            let snap_term = r.u64()?;
            let membership = read_membership(&mut r, limits)?;
            let len = r.u64()?;
            if len > limits.max_snapshot_bytes {
                return Err(DecodeError::SnapshotTooLarge { len, max: limits.max_snapshot_bytes });
            }
            let data = r.bytes(len)?.to_vec();
            Message::InstallSnapshot {
                term,
                from,
                to,
                snapshot: Snapshot { meta: SnapshotMeta { index, term: snap_term, membership }, data },
            }
        }
        KIND_SNAPSHOT_REPLY => Message::SnapshotReply { term, from, to, index: r.u64()? },
        KIND_TIMEOUT_NOW => Message::TimeoutNow { term, from, to },
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    msg.validate(limits)?;
    Ok(msg)
}

/// Appends the encoding of `membership` (the data of an
/// [`EntryKind::Membership`] entry) to `out`.
pub fn encode_membership(membership: &Membership, out: &mut Vec<u8>) {
    put_u32(out, len_u32(membership.voters.len()));
    for id in &membership.voters {
        put_u64(out, *id);
    }
    put_u32(out, len_u32(membership.learners.len()));
    for id in &membership.learners {
        put_u64(out, *id);
    }
}

/// Decodes exactly one membership from `bytes`: ids non-zero and strictly
/// ascending within each set, the sets disjoint, at most
/// `limits.max_members` members.
pub fn decode_membership(bytes: &[u8], limits: &DecodeLimits) -> Result<Membership, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let membership = read_membership(&mut r, limits)?;
    r.finish()?;
    Ok(membership)
}

/// Checks an in-memory membership against the rules `decode_membership`
/// enforces.
pub fn validate_membership(membership: &Membership, limits: &DecodeLimits) -> Result<(), DecodeError> {
    let count = membership.voters.len() + membership.learners.len();
    if count > limits.max_members {
        return Err(DecodeError::TooManyMembers { count: count as u64, max: limits.max_members });
    }
    if membership.voters.contains(&0) || membership.learners.contains(&0) {
        return Err(DecodeError::InvalidMembership("member id 0"));
    }
    if !membership.voters.is_disjoint(&membership.learners) {
        return Err(DecodeError::InvalidMembership("a member is both voter and learner"));
    }
    Ok(())
}

fn read_membership(r: &mut Reader<'_>, limits: &DecodeLimits) -> Result<Membership, DecodeError> {
    let voters = read_id_set(r, limits, 0)?;
    let learners = read_id_set(r, limits, voters.len())?;
    let membership = Membership { voters, learners };
    validate_membership(&membership, limits)?;
    Ok(membership)
}

fn read_id_set(
    r: &mut Reader<'_>,
    limits: &DecodeLimits,
    already: usize,
) -> Result<BTreeSet<NodeId>, DecodeError> {
    let count = r.u32()? as u64;
    if count.saturating_add(already as u64) > limits.max_members as u64 {
        return Err(DecodeError::TooManyMembers {
            count: count.saturating_add(already as u64),
            max: limits.max_members,
        });
    }
    r.need(count.saturating_mul(8))?;
    let mut set = BTreeSet::new();
    let mut previous = 0;
    for _ in 0..count {
        let id = r.u64()?;
        if id <= previous {
            return Err(DecodeError::InvalidMembership("ids not strictly ascending and non-zero"));
        }
        previous = id;
        set.insert(id);
    }
    Ok(set)
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Lengths are u32 on the wire; anything longer cannot be a valid message
/// under any `DecodeLimits` the node produces, so it is a caller bug.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("length exceeds the wire format's u32")
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn need(&self, n: u64) -> Result<(), DecodeError> {
        let remaining = self.remaining() as u64;
        if n > remaining {
            return Err(DecodeError::Truncated { needed: n, remaining });
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64) -> Result<&'a [u8], DecodeError> {
        self.need(n)?;
        let n = n as usize; // n <= remaining, so it fits in usize.
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidBool(other)),
        }
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A LEB128 `u64` in its shortest form: anything else (a final zero
    /// byte after the first, more than 64 bits) is refused, so that every
    /// decoded message encodes back to the same bytes.
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7F);
            if i == 9 && b > 1 {
                return Err(DecodeError::BadVarint);
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(DecodeError::BadVarint);
                }
                return Ok(v);
            }
        }
        Err(DecodeError::BadVarint)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}
