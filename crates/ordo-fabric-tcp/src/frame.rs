//! The wire format: fixed 24-byte little-endian headers, then a payload.
//!
//! # Invariants
//! - Every frame starts with a [`FrameHeader`] of [`HEADER_LEN`] bytes; its
//!   `len` field counts the payload bytes that follow, nothing else.
//! - A header is validated *before* any of its payload is read into the
//!   region ([`check_data_header`]), so a frame that claims too much, points
//!   outside the region or has an unknown kind is refused without being
//!   applied and without an allocation sized by its claim.
//! - The first frame each way on a stream is a HELLO of exactly
//!   [`HELLO_FRAME_LEN`] bytes, and each side's second is a PROOF of exactly
//!   [`PROOF_FRAME_LEN`] bytes (the handshake, see the crate docs); a HELLO
//!   or PROOF anywhere else is a bad frame.
//! - WRITE sequence numbers are per stream, start at 1 and increase by one;
//!   an ACK carries the highest applied WRITE sequence number (cumulative).

use ordo_fabric::MemberId;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 24;
/// Bytes in a HELLO payload.
pub const HELLO_LEN: usize = 48;
/// Bytes in a PROOF payload (an HMAC-SHA-256 tag).
pub const PROOF_LEN: usize = ordo_auth::handshake::PROOF_LEN;
/// Bytes in a whole PROOF frame (header and payload).
pub const PROOF_FRAME_LEN: usize = HEADER_LEN + PROOF_LEN;
/// Bytes of the handshake nonce in a HELLO.
pub const NONCE_LEN: usize = ordo_auth::handshake::NONCE_LEN;
/// Bytes in a whole HELLO frame (header and payload).
pub const HELLO_FRAME_LEN: usize = HEADER_LEN + HELLO_LEN;
/// The protocol version this crate speaks; a peer speaking another is refused.
pub const PROTOCOL_VERSION: u16 = 2;
/// The first four bytes of a HELLO payload.
pub const HELLO_MAGIC: [u8; 4] = *b"ORDO";
/// WRITE flag: the receiver must acknowledge this write (and all before it).
pub const FLAG_SIGNALED: u8 = 0x01;

/// Frame kinds (the header's first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Handshake; first frame each way, never again.
    Hello = 1,
    /// `len` payload bytes to store at `offset` of the receiver's region.
    Write = 2,
    /// Cumulative acknowledgement: every WRITE with `seq` ≤ this one's is applied.
    Ack = 3,
    /// Handshake; second frame each way: the sender's proof of the secret.
    Proof = 4,
}

impl FrameKind {
    /// The kind for a header byte, if it is one.
    pub fn from_byte(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Hello),
            2 => Some(FrameKind::Write),
            3 => Some(FrameKind::Ack),
            4 => Some(FrameKind::Proof),
            _ => None,
        }
    }
}

/// A frame header as it is on the wire (all fields little-endian):
///
/// | bytes | field | meaning |
/// |---|---|---|
/// | 0 | `kind` | [`FrameKind`] |
/// | 1 | `flags` | [`FLAG_SIGNALED`] on WRITE; 0 otherwise |
/// | 2..4 | `reserved` | 0 |
/// | 4..8 | `len` | payload bytes after the header |
/// | 8..16 | `offset` | WRITE: region offset; otherwise 0 |
/// | 16..24 | `seq` | WRITE: its sequence number; ACK: highest applied; HELLO: incarnation |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FrameHeader {
    /// A [`FrameKind`] byte (any byte parses; [`check_data_header`] refuses unknown ones).
    pub kind: u8,
    /// [`FLAG_SIGNALED`] on a WRITE; 0 otherwise.
    pub flags: u8,
    /// Must be 0.
    pub reserved: u16,
    /// Payload bytes that follow the header.
    pub len: u32,
    /// WRITE: where in the region the payload goes; otherwise 0.
    pub offset: u64,
    /// WRITE: its sequence number; ACK: highest applied; HELLO: incarnation.
    pub seq: u64,
}

impl FrameHeader {
    /// A WRITE header.
    pub fn write(offset: u64, len: u32, seq: u64, signaled: bool) -> FrameHeader {
        let flags = if signaled { FLAG_SIGNALED } else { 0 };
        FrameHeader { kind: FrameKind::Write as u8, flags, reserved: 0, len, offset, seq }
    }

    /// An ACK header acknowledging every WRITE up to `seq`.
    pub fn ack(seq: u64) -> FrameHeader {
        FrameHeader { kind: FrameKind::Ack as u8, flags: 0, reserved: 0, len: 0, offset: 0, seq }
    }

    /// The header's wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.reserved.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Parses wire bytes (any bytes parse; validation is separate).
    pub fn decode(b: &[u8; HEADER_LEN]) -> FrameHeader {
        FrameHeader {
            kind: b[0],
            flags: b[1],
            reserved: u16::from_le_bytes([b[2], b[3]]),
            len: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            offset: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            seq: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        }
    }
}

/// The handshake each side sends first. Header: kind HELLO, `len` =
/// [`HELLO_LEN`], `offset` 0, `seq` = the sender's incarnation. Payload:
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | magic `"ORDO"` |
/// | 4..6 | protocol version |
/// | 6..8 | reserved (0) |
/// | 8..12 | sender's member id |
/// | 12..16 | reserved (0) |
/// | 16..24 | region length in bytes |
/// | 24..32 | cluster name hash ([`cluster_hash`]) |
/// | 32..48 | handshake nonce: 16 fresh random bytes per connection |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub version: u16,
    /// The sender's member id.
    pub member: MemberId,
    /// The sender's region length (must equal the receiver's).
    pub region_len: u64,
    /// [`cluster_hash`] of the sender's cluster name (must equal the receiver's).
    pub cluster_hash: u64,
    /// The sender endpoint's incarnation (carried in the header's `seq`).
    pub incarnation: u64,
    /// Fresh random bytes of this connection's handshake.
    pub nonce: [u8; NONCE_LEN],
}

impl Hello {
    /// The whole HELLO frame's wire bytes.
    pub fn encode(&self) -> [u8; HELLO_FRAME_LEN] {
        let header = FrameHeader {
            kind: FrameKind::Hello as u8,
            flags: 0,
            reserved: 0,
            len: HELLO_LEN as u32,
            offset: 0,
            seq: self.incarnation,
        };
        let mut b = [0u8; HELLO_FRAME_LEN];
        b[..HEADER_LEN].copy_from_slice(&header.encode());
        let p = &mut b[HEADER_LEN..];
        p[0..4].copy_from_slice(&HELLO_MAGIC);
        p[4..6].copy_from_slice(&self.version.to_le_bytes());
        p[8..12].copy_from_slice(&self.member.to_le_bytes());
        p[16..24].copy_from_slice(&self.region_len.to_le_bytes());
        p[24..32].copy_from_slice(&self.cluster_hash.to_le_bytes());
        p[32..48].copy_from_slice(&self.nonce);
        b
    }

    /// Parses and checks the framing of a HELLO (kind, length, magic,
    /// reserved fields). Whether its contents match is
    /// [`Hello::check_matches`]' business.
    pub fn decode(b: &[u8; HELLO_FRAME_LEN]) -> Result<Hello, FrameError> {
        let header = FrameHeader::decode(b[..HEADER_LEN].try_into().expect("header bytes"));
        if header.kind != FrameKind::Hello as u8 {
            return Err(FrameError::ExpectedHello { kind: header.kind });
        }
        if header.flags != 0 || header.reserved != 0 || header.offset != 0 {
            return Err(FrameError::NonZeroReserved);
        }
        if header.len as usize != HELLO_LEN {
            return Err(FrameError::BadHelloLength { len: header.len });
        }
        let p = &b[HEADER_LEN..];
        if p[0..4] != HELLO_MAGIC {
            return Err(FrameError::BadMagic);
        }
        if p[6..8] != [0, 0] || p[12..16] != [0; 4] {
            return Err(FrameError::NonZeroReserved);
        }
        Ok(Hello {
            version: u16::from_le_bytes([p[4], p[5]]),
            member: u32::from_le_bytes(p[8..12].try_into().expect("4 bytes")),
            region_len: u64::from_le_bytes(p[16..24].try_into().expect("8 bytes")),
            cluster_hash: u64::from_le_bytes(p[24..32].try_into().expect("8 bytes")),
            incarnation: header.seq,
            nonce: p[32..48].try_into().expect("16 bytes"),
        })
    }

    /// Checks that a peer's HELLO speaks our version, names our cluster and
    /// has our region length. (Which member ids are acceptable depends on the
    /// side of the connection and is checked by the caller.)
    pub fn check_matches(&self, ours: &Hello) -> Result<(), FrameError> {
        if self.version != ours.version {
            return Err(FrameError::VersionMismatch { theirs: self.version, ours: ours.version });
        }
        if self.cluster_hash != ours.cluster_hash {
            return Err(FrameError::ClusterMismatch);
        }
        if self.region_len != ours.region_len {
            return Err(FrameError::RegionLenMismatch { theirs: self.region_len, ours: ours.region_len });
        }
        Ok(())
    }
}

/// A PROOF frame: header kind PROOF, `len` = [`PROOF_LEN`], other fields
/// 0; payload the tag of [`ordo_auth::handshake::proof`] over both HELLO
/// frames (the dialer's first).
pub fn encode_proof(tag: &[u8; PROOF_LEN]) -> [u8; PROOF_FRAME_LEN] {
    let header = FrameHeader {
        kind: FrameKind::Proof as u8,
        flags: 0,
        reserved: 0,
        len: PROOF_LEN as u32,
        offset: 0,
        seq: 0,
    };
    let mut b = [0u8; PROOF_FRAME_LEN];
    b[..HEADER_LEN].copy_from_slice(&header.encode());
    b[HEADER_LEN..].copy_from_slice(tag);
    b
}

/// Checks a PROOF frame's framing; returns its tag.
pub fn decode_proof(b: &[u8; PROOF_FRAME_LEN]) -> Result<&[u8], FrameError> {
    let header = FrameHeader::decode(b[..HEADER_LEN].try_into().expect("header bytes"));
    if header.kind != FrameKind::Proof as u8 {
        return Err(FrameError::ExpectedProof { kind: header.kind });
    }
    if header.flags != 0 || header.reserved != 0 || header.offset != 0 || header.seq != 0 {
        return Err(FrameError::NonZeroReserved);
    }
    if header.len as usize != PROOF_LEN {
        return Err(FrameError::BadProofLength { len: header.len });
    }
    Ok(&b[HEADER_LEN..])
}

/// FNV-1a (64-bit) of a cluster name: what a HELLO carries to tell clusters apart.
pub fn cluster_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A frame after the handshake, validated against the receiver's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataFrame {
    /// Store `len` bytes at `offset`; `seq` is the next expected one.
    Write {
        /// Byte offset in the region; `offset + len` lies inside it.
        offset: usize,
        /// Payload length in bytes (at most the receiver's frame limit).
        len: usize,
        /// This WRITE's sequence number (checked equal to the expected one).
        seq: u64,
        /// Whether the sender asked for a completion (`FLAG_SIGNALED`).
        signaled: bool,
    },
    /// The peer has applied every WRITE we sent with sequence ≤ `seq`.
    Ack {
        /// Highest applied WRITE sequence number (cumulative).
        seq: u64,
    },
}

/// Why a frame was refused. Any of these closes the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)] // the messages say it
pub enum FrameError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("HELLO after the handshake")]
    UnexpectedHello,
    #[error("PROOF after the handshake")]
    UnexpectedProof,
    #[error("expected a PROOF, got kind {kind}")]
    ExpectedProof { kind: u8 },
    #[error("PROOF payload of {len} bytes (expected {PROOF_LEN})")]
    BadProofLength { len: u32 },
    #[error(
        "the peer's proof does not verify: it does not hold this cluster's secret (or replayed a handshake)"
    )]
    BadProof,
    #[error("expected a HELLO first, got kind {kind}")]
    ExpectedHello { kind: u8 },
    #[error("HELLO payload of {len} bytes (expected {HELLO_LEN})")]
    BadHelloLength { len: u32 },
    #[error("bad HELLO magic")]
    BadMagic,
    #[error("reserved header bits are not zero")]
    NonZeroReserved,
    #[error("unknown flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLong { len: u32, max: usize },
    #[error("write [{offset}, +{len}) lies outside the region of {region_len} bytes")]
    OutOfRegion { offset: u64, len: u32, region_len: usize },
    #[error("write sequence {got}, expected {expected}")]
    OutOfSequence { got: u64, expected: u64 },
    #[error("ACK with a payload, offset or flags")]
    MalformedAck,
    #[error("ACK of sequence {got}, but {acked} is acked and {posted} posted")]
    BadAck { got: u64, acked: u64, posted: u64 },
    #[error("protocol version {theirs}, ours is {ours}")]
    VersionMismatch { theirs: u16, ours: u16 },
    #[error("cluster name differs")]
    ClusterMismatch,
    #[error("region length {theirs}, ours is {ours}")]
    RegionLenMismatch { theirs: u64, ours: u64 },
    #[error("member {0} is not a peer this side accepts on this connection")]
    UnexpectedMember(MemberId),
}

/// Validates a header received after the handshake, before any of its
/// payload is touched. `expected_seq` is the sequence number the next WRITE
/// must carry.
pub fn check_data_header(
    h: &FrameHeader,
    max_frame_bytes: usize,
    region_len: usize,
    expected_seq: u64,
) -> Result<DataFrame, FrameError> {
    if h.reserved != 0 {
        return Err(FrameError::NonZeroReserved);
    }
    match FrameKind::from_byte(h.kind) {
        None => Err(FrameError::UnknownKind(h.kind)),
        Some(FrameKind::Hello) => Err(FrameError::UnexpectedHello),
        Some(FrameKind::Proof) => Err(FrameError::UnexpectedProof),
        Some(FrameKind::Ack) => {
            if h.len != 0 || h.offset != 0 || h.flags != 0 {
                return Err(FrameError::MalformedAck);
            }
            Ok(DataFrame::Ack { seq: h.seq })
        }
        Some(FrameKind::Write) => {
            if h.flags & !FLAG_SIGNALED != 0 {
                return Err(FrameError::UnknownFlags(h.flags));
            }
            let len = h.len as usize;
            if len > max_frame_bytes {
                return Err(FrameError::TooLong { len: h.len, max: max_frame_bytes });
            }
            let out_of_region = FrameError::OutOfRegion { offset: h.offset, len: h.len, region_len };
            let offset = usize::try_from(h.offset).map_err(|_| out_of_region.clone())?;
            match offset.checked_add(len) {
                Some(end) if end <= region_len => {}
                _ => return Err(out_of_region),
            }
            if h.seq != expected_seq {
                return Err(FrameError::OutOfSequence { got: h.seq, expected: expected_seq });
            }
            Ok(DataFrame::Write { offset, len, seq: h.seq, signaled: h.flags & FLAG_SIGNALED != 0 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader::write(0x1122_3344_5566, 77, 9, true);
        assert_eq!(FrameHeader::decode(&h.encode()), h);
        assert_eq!(h.encode()[0], FrameKind::Write as u8);
        assert_eq!(h.encode()[4..8], 77u32.to_le_bytes());
    }

    #[test]
    fn hello_round_trips_and_checks() {
        let ours = Hello {
            version: PROTOCOL_VERSION,
            member: 3,
            region_len: 4096,
            cluster_hash: cluster_hash("a"),
            incarnation: 42,
            nonce: [7; NONCE_LEN],
        };
        let back = Hello::decode(&ours.encode()).unwrap();
        assert_eq!(back, ours);
        assert_eq!(back.check_matches(&ours), Ok(()));
        let other = Hello { cluster_hash: cluster_hash("b"), ..ours };
        assert_eq!(other.check_matches(&ours), Err(FrameError::ClusterMismatch));
        let other = Hello { region_len: 8192, ..ours };
        assert!(matches!(other.check_matches(&ours), Err(FrameError::RegionLenMismatch { .. })));
        let mut bytes = ours.encode();
        bytes[HEADER_LEN] = b'X';
        assert_eq!(Hello::decode(&bytes), Err(FrameError::BadMagic));
    }

    #[test]
    fn proof_frames_round_trip_and_are_refused_elsewhere() {
        let tag = [9u8; PROOF_LEN];
        let frame = encode_proof(&tag);
        assert_eq!(decode_proof(&frame), Ok(&tag[..]));
        let mut bad = frame;
        bad[16] = 1;
        assert_eq!(decode_proof(&bad), Err(FrameError::NonZeroReserved));
        bad = frame;
        bad[0] = FrameKind::Write as u8;
        assert_eq!(decode_proof(&bad), Err(FrameError::ExpectedProof { kind: 2 }));
        let header = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap());
        assert_eq!(check_data_header(&header, 64, 16, 1), Err(FrameError::UnexpectedProof));
    }

    #[test]
    fn data_headers_are_checked_before_payload() {
        let ok = FrameHeader::write(8, 8, 1, false);
        assert!(matches!(check_data_header(&ok, 64, 16, 1), Ok(DataFrame::Write { offset: 8, len: 8, .. })));
        let outside = FrameHeader::write(9, 8, 1, false);
        assert!(matches!(check_data_header(&outside, 64, 16, 1), Err(FrameError::OutOfRegion { .. })));
        let wraps = FrameHeader::write(u64::MAX, 8, 1, false);
        assert!(matches!(check_data_header(&wraps, 64, 16, 1), Err(FrameError::OutOfRegion { .. })));
        let huge = FrameHeader::write(0, u32::MAX, 1, false);
        assert!(matches!(check_data_header(&huge, 64, 16, 1), Err(FrameError::TooLong { .. })));
        let unknown = FrameHeader { kind: 9, ..ok };
        assert_eq!(check_data_header(&unknown, 64, 16, 1), Err(FrameError::UnknownKind(9)));
        let hello = FrameHeader { kind: FrameKind::Hello as u8, ..ok };
        assert_eq!(check_data_header(&hello, 64, 16, 1), Err(FrameError::UnexpectedHello));
        assert!(matches!(check_data_header(&ok, 64, 16, 2), Err(FrameError::OutOfSequence { .. })));
        let flags = FrameHeader { flags: 0x80, ..ok };
        assert_eq!(check_data_header(&flags, 64, 16, 1), Err(FrameError::UnknownFlags(0x80)));
        let ack = FrameHeader::ack(5);
        assert_eq!(check_data_header(&ack, 64, 16, 1), Ok(DataFrame::Ack { seq: 5 }));
        let bad_ack = FrameHeader { len: 1, ..ack };
        assert_eq!(check_data_header(&bad_ack, 64, 16, 1), Err(FrameError::MalformedAck));
    }
}
