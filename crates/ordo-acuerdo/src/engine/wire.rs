//! The ring message format (beyond the paper, which leaves it open): a
//! header of little-endian words — two for the messages of the log, four
//! for the others ([`header_len`]) — then the body.
//!
//! ```text
//! word 0: kind (low byte) | diff serial << 8 (24 bits) | entry count << 32 (DiffEnd)
//! Normal      [kind, header]                  body: the payload
//! DiffEntry   [kind, header]                  body: the payload
//! DiffEnd     [kind, epoch's header 0, base, upto]
//! SnapChunk   [kind, base, offset, total]     body: snapshot bytes [offset, offset + len)
//! ```
//!
//! A Normal message of up to 8 body bytes, with the ring's 16-byte slot
//! header and 8-byte trailer stamp, fills one cache line (with a 32-byte
//! header for every kind it took two).
//!
//! # Invariants
//! - [`parse`] never panics on a peer's bytes: a short or unknown message is
//!   an error (the engine reports it as [`super::Note::BadMessage`]).
//! - Bodies come from and return to a bounded pool ([`recycle`]), so the
//!   log allocates no buffer per message once warm.

use crate::config::WIRE_HEADER_LEN;
use crate::header::{Epoch, Header};

/// Wire kinds of ring messages (low byte of the first header word).
pub(super) const KIND_NORMAL: u64 = 1;
pub(super) const KIND_DIFF_ENTRY: u64 = 2;
pub(super) const KIND_DIFF_END: u64 = 3;
pub(super) const KIND_SNAP_CHUNK: u64 = 4;

/// Bytes of the header of a message of `kind`: 16 for the log's messages
/// (Normal, DiffEntry), [`WIRE_HEADER_LEN`] for the rest.
pub(super) fn header_len(kind: u64) -> usize {
    if kind == KIND_NORMAL || kind == KIND_DIFF_ENTRY { 16 } else { WIRE_HEADER_LEN }
}

/// A parsed ring message.
pub(super) enum Wire {
    Normal { header: Header, body: Vec<u8> },
    DiffEntry { serial: u32, header: Header, body: Vec<u8> },
    DiffEnd { serial: u32, epoch: Epoch, base: Header, upto: Header, entries: u32 },
    SnapChunk { serial: u32, header: Header, offset: u64, total: u64, body: Vec<u8> },
}

/// Spare message bodies kept for reuse, at most, and the largest kept
/// (bounds the pool's memory to 1 MiB).
const POOL_MAX: usize = 256;
const POOL_BODY_MAX: usize = 4096;

/// Returns a parsed message's body, if it has one, to the pool.
pub(super) fn recycle_wire(pool: &mut Vec<Vec<u8>>, wire: Wire) {
    if let Wire::Normal { body, .. } | Wire::DiffEntry { body, .. } | Wire::SnapChunk { body, .. } = wire {
        recycle(pool, body);
    }
}

/// Returns a body to the pool (cleared).
pub(super) fn recycle(pool: &mut Vec<Vec<u8>>, mut body: Vec<u8>) {
    if pool.len() < POOL_MAX && body.capacity() <= POOL_BODY_MAX {
        body.clear();
        pool.push(body);
    }
    assert!(pool.len() <= POOL_MAX, "the pool is bounded");
}

/// Parses a ring payload (never panics on a peer's bytes); the body goes
/// into a buffer from `pool`.
pub(super) fn parse(bytes: &[u8], pool: &mut Vec<Vec<u8>>) -> Result<Wire, String> {
    let Some(first) = bytes.first_chunk::<8>() else {
        return Err(format!("message of {} bytes is shorter than its header", bytes.len()));
    };
    // The first word is read once: the peer may rewrite its slot meanwhile
    // (the caller then drops the result, `RingReceiver::still_there`), and
    // the kind must not change between the length check and the match.
    let w0 = u64::from_le_bytes(*first);
    let kind = w0 & 0xFF;
    if !(KIND_NORMAL..=KIND_SNAP_CHUNK).contains(&kind) {
        return Err(format!("unknown message kind {kind}"));
    }
    let len = header_len(kind);
    if bytes.len() < len {
        return Err(format!("message of {} bytes is shorter than its {len}-byte header", bytes.len()));
    }
    // Only words of the header are read: below `len` (and never past the
    // slice, whatever the bytes say).
    let w = |i: usize| {
        debug_assert!(8 * i + 8 <= len);
        bytes.get(8 * i..8 * i + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let mut body = pool.pop().unwrap_or_default();
    debug_assert!(body.is_empty(), "pooled bodies are cleared");
    body.extend_from_slice(&bytes[len..]);
    let serial = ((w0 >> 8) & 0xFF_FFFF) as u32;
    match kind {
        KIND_NORMAL => Ok(Wire::Normal { header: Header::decode(w(1)), body }),
        KIND_DIFF_ENTRY => Ok(Wire::DiffEntry { serial, header: Header::decode(w(1)), body }),
        KIND_SNAP_CHUNK => {
            Ok(Wire::SnapChunk { serial, header: Header::decode(w(1)), offset: w(2), total: w(3), body })
        }
        KIND_DIFF_END => Ok(Wire::DiffEnd {
            serial,
            epoch: Header::decode(w(1)).epoch,
            base: Header::decode(w(2)),
            upto: Header::decode(w(3)),
            entries: (w0 >> 32) as u32,
        }),
        k => Err(format!("unknown message kind {k}")),
    }
}
