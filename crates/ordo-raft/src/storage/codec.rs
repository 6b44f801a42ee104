//! Byte formats of the durable log. All integers are little-endian.
//!
//! ```text
//! log record:   [len u32][crc32 u32][body: len bytes]
//!               crc32 covers the 4 len bytes then the body
//!               body = [type u8 = 1 (entry)][term u64][index u64][kind u8][data ...]
//!               kind: 0 Normal, 1 Noop, 2 Membership
//! hard state:   ["ORDOHS01"][term u64][vote u64, 0 = none][commit u64][crc32 u32 of the previous 32 bytes]
//! snapshot:     ["ORDOSNP1"][body_len u64][crc32 u32 of body][body]
//!               body = [index u64][term u64][n_voters u32][voter u64 ...]
//!                      [n_learners u32][learner u64 ...][data ...]
//! ```
//!
//! Every decoder bounds what it allocates by the bytes it was given (or by
//! `max_record_bytes`), and rejects malformed input with a typed error.

use bytes::Bytes;
use std::collections::BTreeSet;

use super::StorageError;
use crate::types::{Entry, EntryKind, HardState, Membership, Snapshot, SnapshotMeta};

/// Bytes of a record header (`len` + `crc32`).
pub const RECORD_HEADER_BYTES: usize = 8;
/// Smallest valid record body (type, term, index, kind).
pub const RECORD_MIN_BODY_BYTES: usize = 1 + 8 + 8 + 1;
/// The largest index or snapshot index accepted from disk; leaves room for
/// `index + 1` arithmetic everywhere.
pub const MAX_INDEX: u64 = u64::MAX / 2;
/// Bytes of an encoded hard state.
pub const HARD_STATE_BYTES: usize = 8 + 24 + 4;

const RECORD_TYPE_ENTRY: u8 = 1;
const HARD_STATE_MAGIC: &[u8; 8] = b"ORDOHS01";
const SNAPSHOT_MAGIC: &[u8; 8] = b"ORDOSNP1";
const SNAPSHOT_HEADER_BYTES: usize = 8 + 8 + 4;

fn kind_code(kind: &EntryKind) -> u8 {
    match kind {
        EntryKind::Normal => 0,
        EntryKind::Noop => 1,
        EntryKind::Membership => 2,
    }
}

fn record_crc(len: u32, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len.to_le_bytes());
    hasher.update(body);
    hasher.finalize()
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// The body length of `entry`'s record.
pub(crate) fn record_body_len(entry: &Entry) -> usize {
    RECORD_MIN_BODY_BYTES + entry.data.len()
}

/// Appends `entry`'s record to `out`. The caller checked the body length
/// against `max_record_bytes` (which is below `u32::MAX`).
pub(crate) fn encode_record(entry: &Entry, out: &mut Vec<u8>) {
    let body_len = record_body_len(entry);
    let len = u32::try_from(body_len).expect("record length checked against max_record_bytes");
    let start = out.len();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(RECORD_TYPE_ENTRY);
    out.extend_from_slice(&entry.term.to_le_bytes());
    out.extend_from_slice(&entry.index.to_le_bytes());
    out.push(kind_code(&entry.kind));
    out.extend_from_slice(&entry.data);
    let crc = record_crc(len, &out[start + RECORD_HEADER_BYTES..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The outcome of reading one record at an offset.
#[derive(Debug)]
pub(crate) enum RecordRead {
    /// A valid record; the next one starts at `next`.
    Entry { entry: Entry, next: usize },
    /// The buffer ends inside the header or the body.
    Incomplete,
    /// The header claims more than `max_record_bytes`.
    TooLarge { len: u64 },
    /// The length is below the minimum body, the checksum fails, or the
    /// body does not decode.
    Bad { reason: &'static str },
}

/// Reads the record at `offset` of `buf` without allocating more than the
/// record's (bounded) data.
pub(crate) fn read_record(buf: &[u8], offset: usize, max_record_bytes: usize) -> RecordRead {
    let rest = &buf[offset.min(buf.len())..];
    if rest.len() < RECORD_HEADER_BYTES {
        return RecordRead::Incomplete;
    }
    let len = u32_at(rest, 0);
    let body_len = len as usize;
    if body_len > max_record_bytes {
        return RecordRead::TooLarge { len: u64::from(len) };
    }
    if body_len < RECORD_MIN_BODY_BYTES {
        return RecordRead::Bad { reason: "record length below the minimum" };
    }
    if rest.len() - RECORD_HEADER_BYTES < body_len {
        return RecordRead::Incomplete;
    }
    let body = &rest[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + body_len];
    // Cheap structural checks first, so that scanning damaged bytes for a
    // valid record rarely pays for a checksum.
    if body[0] != RECORD_TYPE_ENTRY {
        return RecordRead::Bad { reason: "unknown record type" };
    }
    let term = u64_at(body, 1);
    let index = u64_at(body, 9);
    let kind = match body[17] {
        0 => EntryKind::Normal,
        1 => EntryKind::Noop,
        2 => EntryKind::Membership,
        _ => return RecordRead::Bad { reason: "unknown entry kind" },
    };
    if index == 0 || index > MAX_INDEX {
        return RecordRead::Bad { reason: "entry index out of range" };
    }
    if record_crc(len, body) != u32_at(rest, 4) {
        return RecordRead::Bad { reason: "record checksum mismatch" };
    }
    let entry = Entry { term, index, kind, data: Bytes::copy_from_slice(&body[RECORD_MIN_BODY_BYTES..]) };
    RecordRead::Entry { entry, next: offset + RECORD_HEADER_BYTES + body_len }
}

/// Whether any valid record starts in `buf` after `offset` (used to tell a
/// torn tail from damage in the middle of the log). Linear in the bytes
/// after `offset` times the rare positions that pass the structural checks;
/// a torn tail is short, so this is cheap where it matters.
pub(crate) fn valid_record_after(buf: &[u8], offset: usize, max_record_bytes: usize) -> bool {
    (offset + 1..buf.len().saturating_sub(RECORD_HEADER_BYTES - 1))
        .any(|at| matches!(read_record(buf, at, max_record_bytes), RecordRead::Entry { .. }))
}

/// Encodes a hard state (fixed [`HARD_STATE_BYTES`]).
pub fn encode_hard_state(hard_state: &HardState) -> Vec<u8> {
    let mut out = Vec::with_capacity(HARD_STATE_BYTES);
    out.extend_from_slice(HARD_STATE_MAGIC);
    out.extend_from_slice(&hard_state.term.to_le_bytes());
    out.extend_from_slice(&hard_state.vote.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&hard_state.commit.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a hard state; `file` names the source in errors.
pub fn decode_hard_state(buf: &[u8], file: &str) -> Result<HardState, StorageError> {
    let corrupt = |offset: u64, reason| StorageError::Corrupt { file: file.to_string(), offset, reason };
    if buf.len() != HARD_STATE_BYTES {
        return Err(corrupt(0, "hard state has the wrong length"));
    }
    if &buf[..8] != HARD_STATE_MAGIC {
        return Err(corrupt(0, "hard state magic mismatch"));
    }
    if crc32fast::hash(&buf[..32]) != u32_at(buf, 32) {
        return Err(corrupt(32, "hard state checksum mismatch"));
    }
    let vote = u64_at(buf, 16);
    Ok(HardState { term: u64_at(buf, 8), vote: (vote != 0).then_some(vote), commit: u64_at(buf, 24) })
}

/// Encodes a snapshot file.
pub fn encode_snapshot(snapshot: &Snapshot) -> Vec<u8> {
    let meta = &snapshot.meta;
    let mut body = Vec::with_capacity(
        32 + 8 * (meta.membership.voters.len() + meta.membership.learners.len()) + snapshot.data.len(),
    );
    body.extend_from_slice(&meta.index.to_le_bytes());
    body.extend_from_slice(&meta.term.to_le_bytes());
    for set in [&meta.membership.voters, &meta.membership.learners] {
        let count = u32::try_from(set.len()).expect("membership fits in u32");
        body.extend_from_slice(&count.to_le_bytes());
        for id in set {
            body.extend_from_slice(&id.to_le_bytes());
        }
    }
    body.extend_from_slice(&snapshot.data);
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + body.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes a snapshot file; `file` names the source in errors.
pub fn decode_snapshot(buf: &[u8], file: &str) -> Result<Snapshot, StorageError> {
    let corrupt = |offset: usize, reason| StorageError::Corrupt {
        file: file.to_string(),
        offset: offset as u64,
        reason,
    };
    if buf.len() < SNAPSHOT_HEADER_BYTES || &buf[..8] != SNAPSHOT_MAGIC {
        return Err(corrupt(0, "snapshot magic mismatch"));
    }
    let body = &buf[SNAPSHOT_HEADER_BYTES..];
    if u64_at(buf, 8) != body.len() as u64 {
        return Err(corrupt(8, "snapshot length mismatch"));
    }
    if crc32fast::hash(body) != u32_at(buf, 16) {
        return Err(corrupt(16, "snapshot checksum mismatch"));
    }
    let mut at = 0;
    let need = |at: usize, n: usize| -> Result<(), StorageError> {
        if body.len() - at < n {
            Err(corrupt(SNAPSHOT_HEADER_BYTES + at, "snapshot body truncated"))
        } else {
            Ok(())
        }
    };
    need(at, 16)?;
    let index = u64_at(body, 0);
    let term = u64_at(body, 8);
    if index > MAX_INDEX {
        return Err(corrupt(SNAPSHOT_HEADER_BYTES, "snapshot index out of range"));
    }
    at += 16;
    let mut sets: [BTreeSet<u64>; 2] = [BTreeSet::new(), BTreeSet::new()];
    for set in &mut sets {
        need(at, 4)?;
        let count = u32_at(body, at) as usize;
        at += 4;
        // Bounded by the bytes present, so a huge count cannot allocate.
        if count > (body.len() - at) / 8 {
            return Err(corrupt(SNAPSHOT_HEADER_BYTES + at - 4, "snapshot membership count too large"));
        }
        for _ in 0..count {
            set.insert(u64_at(body, at));
            at += 8;
        }
    }
    let [voters, learners] = sets;
    let data = body[at..].to_vec();
    Ok(Snapshot { meta: SnapshotMeta { index, term, membership: Membership { voters, learners } }, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry { term, index, kind: EntryKind::Normal, data: Bytes::copy_from_slice(data) }
    }

    #[test]
    fn record_round_trips_and_detects_damage() {
        let mut buf = Vec::new();
        encode_record(&entry(7, 3, b"hello"), &mut buf);
        match read_record(&buf, 0, 1024) {
            RecordRead::Entry { entry: e, next } => {
                assert_eq!(e, entry(7, 3, b"hello"));
                assert_eq!(next, buf.len());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_record(&buf[..buf.len() - 1], 0, 1024), RecordRead::Incomplete));
        assert!(matches!(read_record(&buf, 0, 10), RecordRead::TooLarge { .. }));
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(!matches!(read_record(&bad, 0, 1024), RecordRead::Entry { .. }), "bit {bit}");
        }
    }

    #[test]
    fn hard_state_and_snapshot_round_trip() {
        let hs = HardState { term: 9, vote: Some(2), commit: 40 };
        assert_eq!(decode_hard_state(&encode_hard_state(&hs), "hs").unwrap(), hs);
        let snap = Snapshot {
            meta: SnapshotMeta {
                index: 10,
                term: 4,
                membership: Membership { voters: [1, 2, 3].into(), learners: [9].into() },
            },
            data: b"state".to_vec(),
        };
        let bytes = encode_snapshot(&snap);
        assert_eq!(decode_snapshot(&bytes, "s").unwrap(), snap);
        for cut in 0..bytes.len() {
            assert!(decode_snapshot(&bytes[..cut], "s").is_err());
        }
    }
}
