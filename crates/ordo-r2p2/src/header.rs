//! The R2P2 wire header: one per UDP datagram.
//!
//! # Invariants
//! - Every datagram is `HEADER_SIZE` header bytes followed by exactly
//!   `payload_len` payload bytes (and, with `FLAG_AUTH`, exactly one
//!   authentication trailer); anything else is rejected by [`decode`].
//! - `(client_id, request_id)` names one request for its whole life: every
//!   retry, every datagram of it, its response, its REDIRECT and its ERROR
//!   reply carry the same pair. Duplicate detection (client side: stale or
//!   duplicate responses; replication hook: re-proposed requests) keys on it.
//! - `0 < packet_count <= max_packets` and `packet_id < packet_count`;
//!   `FIRST` is set exactly on packet 0 and `LAST` exactly on packet
//!   `packet_count - 1`. A receiver therefore never allocates for more than
//!   `max_packets` fragments because of a header.
//! - All multi-byte fields are big-endian (network order).
//!
//! # Layout (24 bytes)
//! ```text
//!  byte 0        1            2               3       4..6       6..8
//!  +-------+-------------+--------------+-------+-----------+--------------+
//!  | magic | header_size | type | policy| flags | packet_id | packet_count |
//!  | 0xCC  |     24      | 4 bit| 4 bit |       |   u16     |     u16      |
//!  +-------+-------------+--------------+-------+-----------+--------------+
//!  8..16                 16..20       20..22        22..24
//!  +---------------------+------------+-------------+-------------+
//!  |   client_id u64     | request_id | leader_hint | payload_len |
//!  |                     |    u32     | or answered |    u16      |
//!  +---------------------+------------+-------------+-------------+
//! ```
//! Flags: `FIRST = 0x80`, `LAST = 0x40`, `LEADER_HINT = 0x20` (the
//! `leader_hint` field is meaningful), `AUTH = 0x10` (the datagram ends in
//! a 24-byte authentication trailer after the payload: a counter and a MAC
//! over every byte before it, see [`crate::auth`]), `ANSWERED = 0x08`
//! (REQUEST only, never with `LEADER_HINT`: bytes 20..22 are the
//! *answered span* `s`, and every request of this client numbered below
//! `request_id - s` has had its answer or was given up, so a replicated
//! service may forget their answers — the Raft thesis' §6.3 rule); the
//! other bits must be zero.
//!
//! # Divergences from R2P2 (ATC'19 / epfl-dcsl/r2p2), and why
//! - R2P2's header is 8 bytes with a 16-bit request id that is unique only
//!   together with the client's source address and port. Ordo adds a 64-bit
//!   `client_id` and widens the request id to 32 bits so that a request keeps
//!   its identity across retries sent from another socket and across servers
//!   (a new Raft leader must recognise a request the old one already logged).
//! - R2P2 overloads one 16-bit field as "packet count" in the first packet and
//!   "packet id" in the others. Ordo carries both in every datagram, so each
//!   datagram is validated on its own and a lie about the count is detected
//!   on any fragment, not only the first.
//! - `payload_len` makes truncation (or trailing garbage) detectable without
//!   trusting the UDP length alone.
//! - `leader_hint` (with the `LEADER_HINT` flag) lets any response tell the
//!   client which replica leads, so steady-state REPLICATED_ROUTE requests
//!   take no redirect hop; a REDIRECT carries the leader index there.
//! - The answered span (with the `ANSWERED` flag, in a request) tells the
//!   replicas which of the client's answers it no longer needs: without it
//!   a replica keeps each client's last `session_window` answers (and
//!   snapshots them); with it, only those of requests still outstanding.
//!   A server older than the flag rejects such a request (`BadFlags`),
//!   and a replica older than it cannot read the log commands that carry
//!   the span (it would skip them, and diverge) nor the snapshots that
//!   hold the floors (it stops): upgrade every replica of a cluster at
//!   once (stop, upgrade, start; ordo's Raft formats have no version
//!   negotiation), then the clients — or turn the clients'
//!   `report_answered` off.
//! - Message types `RAFT` (replica to replica, r3p2 §3.2), `REDIRECT` and
//!   `ERROR` are ordo's. R2P2's flow-control ACK for multi-packet requests
//!   and its DROP/feedback messages are not used: a multi-datagram request
//!   is sent in one burst, and loss is handled by the client's retry.

use thiserror::Error;

/// The magic first byte of every datagram (R2P2's).
pub const MAGIC: u8 = 0xCC;
/// The size of the encoded header in bytes.
pub const HEADER_SIZE: usize = 24;
/// The largest UDP payload over IPv4: no datagram is bigger.
pub const MAX_DATAGRAM: usize = 65_507;

/// Flag: this is packet 0 of its message.
pub const FLAG_FIRST: u8 = 0x80;
/// Flag: this is the last packet of its message.
pub const FLAG_LAST: u8 = 0x40;
/// Flag: the `leader_hint` field names the current leader replica.
pub const FLAG_LEADER_HINT: u8 = 0x20;
/// Flag: an authentication trailer ([`ordo_auth::TRAILER_LEN`] bytes)
/// follows the payload.
pub const FLAG_AUTH: u8 = 0x10;
/// Flag (requests only): the `leader_hint` field holds the answered span
/// ([`Header::answered_below`]).
pub const FLAG_ANSWERED: u8 = 0x08;
const KNOWN_FLAGS: u8 = FLAG_FIRST | FLAG_LAST | FLAG_LEADER_HINT | FLAG_AUTH | FLAG_ANSWERED;

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Client → server.
    Request = 0,
    /// Server → client: the handler's answer.
    Response = 1,
    /// Replica → replica: an opaque replication-protocol message (r3p2 §3.2).
    Raft = 2,
    /// Server → client: "send REPLICATED_ROUTE requests to the leader in
    /// `leader_hint`"; the payload is empty or the leader's socket address as
    /// UTF-8 text.
    Redirect = 3,
    /// Server → client: the request was refused; payload = one [`ErrorCode`]
    /// byte followed by a UTF-8 explanation.
    Error = 4,
    /// Client → server: a control command for the replication hook
    /// (membership change, status), routed like REPLICATED_ROUTE; answered
    /// with Response, Redirect or Error.
    Admin = 5,
}

impl MessageType {
    /// Decodes the 4-bit type field.
    pub fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            0 => Self::Request,
            1 => Self::Response,
            2 => Self::Raft,
            3 => Self::Redirect,
            4 => Self::Error,
            5 => Self::Admin,
            _ => return None,
        })
    }
}

/// How a request is routed (R2P2's policy field, plus r3p2's REPLICATED_ROUTE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Policy {
    /// Must be served by the server it was sent to.
    FixedRoute = 0,
    /// Any server may serve it; the client spreads these.
    LbRoute = 1,
    /// Ordered through the replication hook and applied on every replica in
    /// the same order; only the leader answers.
    ReplicatedRoute = 2,
}

impl Policy {
    /// Decodes the 4-bit policy field.
    pub fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            0 => Self::FixedRoute,
            1 => Self::LbRoute,
            2 => Self::ReplicatedRoute,
            _ => return None,
        })
    }
}

/// Why an ERROR message refused a request (first payload byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// REPLICATED_ROUTE request at a server with no replication hook: it is
    /// refused rather than executed unreplicated.
    NotReplicated = 1,
    /// The server (or its hook) refused the request for lack of resources.
    Overloaded = 2,
    /// The replication hook refused the request (e.g. no leader known).
    Rejected = 3,
    /// The request lacks the credential its type needs (an admin command
    /// without the admin secret's MAC, a request without the client MAC
    /// where one is required), or its MAC does not verify; nothing was done.
    Unauthorized = 4,
    /// REPLICATED_ROUTE: the replicas' session of this client no longer
    /// holds the request (it is below the answered span the client, or
    /// someone sending as it, said it has; or older than the session's
    /// window). It was not applied now; whether it was applied before is
    /// unknown. The client takes a new client id for its next requests
    /// (the Raft thesis' SESSION_EXPIRED).
    SessionExpired = 5,
    /// A code this build does not know.
    Unknown = 255,
}

impl ErrorCode {
    /// Decodes the code byte (unknown values map to [`ErrorCode::Unknown`]).
    pub fn from_byte(byte: u8) -> Self {
        match byte {
            1 => Self::NotReplicated,
            2 => Self::Overloaded,
            3 => Self::Rejected,
            4 => Self::Unauthorized,
            5 => Self::SessionExpired,
            _ => Self::Unknown,
        }
    }
}

/// One datagram's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub message_type: MessageType,
    /// How the request is routed (responses echo the request's policy).
    pub policy: Policy,
    /// Raw flag byte (`FLAG_*`); [`encode`] derives FIRST/LAST itself.
    pub flags: u8,
    /// This datagram's index in its message.
    pub packet_id: u16,
    /// How many datagrams the message has (≥ 1).
    pub packet_count: u16,
    /// The client that originated the request (a replica's node id for RAFT).
    pub client_id: u64,
    /// The client's request number (a per-sender sequence for RAFT).
    pub request_id: u32,
    /// Index of the leader replica, meaningful only with `FLAG_LEADER_HINT`;
    /// in a request with `FLAG_ANSWERED`, the answered span instead.
    pub leader_hint: u16,
    /// Payload bytes following the header in this datagram.
    pub payload_len: u16,
}

impl Header {
    /// The leader hint, if the flag says it is meaningful.
    pub fn leader(&self) -> Option<u16> {
        (self.flags & FLAG_LEADER_HINT != 0).then_some(self.leader_hint)
    }

    /// With `FLAG_ANSWERED`: the lowest request id of this client that may
    /// still be unanswered (every lower one was answered or given up).
    pub fn answered_below(&self) -> Option<u32> {
        (self.flags & FLAG_ANSWERED != 0).then(|| self.request_id.wrapping_sub(u32::from(self.leader_hint)))
    }

    /// Sets `FLAG_ANSWERED` and the span for `lowest_unanswered` (at most
    /// `request_id`); leaves the header as it is when the span does not
    /// fit in 16 bits (a shorter span would claim answers the client lacks).
    pub fn set_answered_below(&mut self, lowest_unanswered: u32) {
        debug_assert_eq!(self.message_type, MessageType::Request, "only requests say what was answered");
        debug_assert_eq!(self.flags & FLAG_LEADER_HINT, 0, "the field holds one or the other");
        if let Ok(span) = u16::try_from(self.request_id.wrapping_sub(lowest_unanswered)) {
            self.flags |= FLAG_ANSWERED;
            self.leader_hint = span;
        }
    }
}

/// Why a datagram was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Shorter than the header, or shorter than header + `payload_len`.
    #[error("datagram truncated: {len} bytes, need {need}")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Longer than header + `payload_len`.
    #[error("datagram has {extra} trailing bytes beyond its payload length")]
    TrailingBytes {
        /// Bytes beyond the declared payload.
        extra: usize,
    },
    /// First byte is not [`MAGIC`].
    #[error("bad magic byte {0:#04x}")]
    BadMagic(u8),
    /// The header-size byte is not [`HEADER_SIZE`].
    #[error("header size {0} is not {HEADER_SIZE}")]
    HeaderSizeMismatch(u8),
    /// Unknown message type nibble.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// Unknown policy nibble.
    #[error("unknown policy {0}")]
    UnknownPolicy(u8),
    /// Unknown flag bits, or FIRST/LAST inconsistent with the packet id.
    #[error("bad flags {0:#04x}")]
    BadFlags(u8),
    /// `packet_count == 0`.
    #[error("packet count is zero")]
    ZeroPacketCount,
    /// `packet_count` above the receiver's bound.
    #[error("packet count {count} exceeds the bound {max}")]
    PacketCountTooLarge {
        /// Declared count.
        count: u16,
        /// Configured bound.
        max: u16,
    },
    /// `packet_id >= packet_count`.
    #[error("packet id {id} not below packet count {count}")]
    PacketIdOutOfRange {
        /// Declared id.
        id: u16,
        /// Declared count.
        count: u16,
    },
}

impl DecodeError {
    /// A stable index per variant, for drop counters (0..[`DecodeError::KINDS`]).
    pub fn kind_index(&self) -> usize {
        match self {
            Self::Truncated { .. } => 0,
            Self::TrailingBytes { .. } => 1,
            Self::BadMagic(_) => 2,
            Self::HeaderSizeMismatch(_) => 3,
            Self::UnknownType(_) => 4,
            Self::UnknownPolicy(_) => 5,
            Self::BadFlags(_) => 6,
            Self::ZeroPacketCount => 7,
            Self::PacketCountTooLarge { .. } => 8,
            Self::PacketIdOutOfRange { .. } => 9,
        }
    }
    /// Number of distinct [`DecodeError::kind_index`] values.
    pub const KINDS: usize = 10;
}

/// Writes `header` into `out[..HEADER_SIZE]`. FIRST and LAST are derived
/// from `packet_id`/`packet_count` (any given in `flags` are ignored).
///
/// # Panics
/// If `out` is shorter than [`HEADER_SIZE`] or the header is not valid
/// (`packet_count == 0`, `packet_id >= packet_count`): a caller bug.
pub fn encode(header: &Header, out: &mut [u8]) {
    assert!(out.len() >= HEADER_SIZE, "header buffer too small");
    assert!(header.packet_count > 0 && header.packet_id < header.packet_count, "invalid packet numbering");
    let mut flags = header.flags & (FLAG_LEADER_HINT | FLAG_AUTH | FLAG_ANSWERED);
    assert!(
        flags & FLAG_ANSWERED == 0
            || (header.message_type == MessageType::Request && flags & FLAG_LEADER_HINT == 0),
        "the answered span is a request's, and takes the leader hint's place"
    );
    if header.packet_id == 0 {
        flags |= FLAG_FIRST;
    }
    if header.packet_id == header.packet_count - 1 {
        flags |= FLAG_LAST;
    }
    out[0] = MAGIC;
    out[1] = HEADER_SIZE as u8;
    out[2] = ((header.message_type as u8) << 4) | header.policy as u8;
    out[3] = flags;
    out[4..6].copy_from_slice(&header.packet_id.to_be_bytes());
    out[6..8].copy_from_slice(&header.packet_count.to_be_bytes());
    out[8..16].copy_from_slice(&header.client_id.to_be_bytes());
    out[16..20].copy_from_slice(&header.request_id.to_be_bytes());
    out[20..22].copy_from_slice(&header.leader_hint.to_be_bytes());
    out[22..24].copy_from_slice(&header.payload_len.to_be_bytes());
}

/// Parses and validates one datagram; returns its header and payload.
/// `max_packets` bounds `packet_count` (the receiver's reassembly bound).
pub fn decode(datagram: &[u8], max_packets: u16) -> Result<(Header, &[u8]), DecodeError> {
    if datagram.len() < HEADER_SIZE {
        return Err(DecodeError::Truncated { len: datagram.len(), need: HEADER_SIZE });
    }
    if datagram[0] != MAGIC {
        return Err(DecodeError::BadMagic(datagram[0]));
    }
    if datagram[1] as usize != HEADER_SIZE {
        return Err(DecodeError::HeaderSizeMismatch(datagram[1]));
    }
    let message_type =
        MessageType::from_bits(datagram[2] >> 4).ok_or(DecodeError::UnknownType(datagram[2] >> 4))?;
    let policy =
        Policy::from_bits(datagram[2] & 0x0F).ok_or(DecodeError::UnknownPolicy(datagram[2] & 0x0F))?;
    let flags = datagram[3];
    let u16_at = |at: usize| u16::from_be_bytes([datagram[at], datagram[at + 1]]);
    let packet_id = u16_at(4);
    let packet_count = u16_at(6);
    if packet_count == 0 {
        return Err(DecodeError::ZeroPacketCount);
    }
    if packet_count > max_packets {
        return Err(DecodeError::PacketCountTooLarge { count: packet_count, max: max_packets });
    }
    if packet_id >= packet_count {
        return Err(DecodeError::PacketIdOutOfRange { id: packet_id, count: packet_count });
    }
    let first_ok = (flags & FLAG_FIRST != 0) == (packet_id == 0);
    let last_ok = (flags & FLAG_LAST != 0) == (packet_id == packet_count - 1);
    // The answered span shares the leader hint's bytes, and only a client
    // has answers to report.
    let answered_ok =
        flags & FLAG_ANSWERED == 0 || (message_type == MessageType::Request && flags & FLAG_LEADER_HINT == 0);
    if flags & !KNOWN_FLAGS != 0 || !first_ok || !last_ok || !answered_ok {
        return Err(DecodeError::BadFlags(flags));
    }
    let mut client_id = [0u8; 8];
    client_id.copy_from_slice(&datagram[8..16]);
    let mut request_id = [0u8; 4];
    request_id.copy_from_slice(&datagram[16..20]);
    let payload_len = u16_at(22);
    let trailer = if flags & FLAG_AUTH != 0 { ordo_auth::TRAILER_LEN } else { 0 };
    let need = HEADER_SIZE + payload_len as usize + trailer;
    if datagram.len() < need {
        return Err(DecodeError::Truncated { len: datagram.len(), need });
    }
    if datagram.len() > need {
        return Err(DecodeError::TrailingBytes { extra: datagram.len() - need });
    }
    let header = Header {
        message_type,
        policy,
        flags,
        packet_id,
        packet_count,
        client_id: u64::from_be_bytes(client_id),
        request_id: u32::from_be_bytes(request_id),
        leader_hint: u16_at(20),
        payload_len,
    };
    Ok((header, &datagram[HEADER_SIZE..HEADER_SIZE + payload_len as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header {
            message_type: MessageType::Request,
            policy: Policy::LbRoute,
            flags: 0,
            packet_id: 0,
            packet_count: 1,
            client_id: 0xDEAD_BEEF_0000_0001,
            request_id: 7,
            leader_hint: 0,
            payload_len: 3,
        }
    }

    fn datagram(h: &Header) -> Vec<u8> {
        let mut d = vec![0u8; HEADER_SIZE + h.payload_len as usize];
        encode(h, &mut d);
        d
    }

    #[test]
    fn round_trip_single_packet_sets_first_and_last() {
        let d = datagram(&sample());
        let (h, payload) = decode(&d, 8).unwrap();
        assert_eq!(h.flags, FLAG_FIRST | FLAG_LAST);
        assert_eq!(payload.len(), 3);
        assert_eq!(h.client_id, sample().client_id);
        assert_eq!(h.leader(), None);
    }

    #[test]
    fn rejects_truncated_header_and_payload() {
        let d = datagram(&sample());
        assert_eq!(decode(&d[..10], 8), Err(DecodeError::Truncated { len: 10, need: HEADER_SIZE }));
        assert_eq!(decode(&d[..HEADER_SIZE + 1], 8), Err(DecodeError::Truncated { len: 25, need: 27 }));
        assert_eq!(decode(&[], 8), Err(DecodeError::Truncated { len: 0, need: HEADER_SIZE }));
    }

    #[test]
    fn rejects_trailing_bytes() {
        let mut d = datagram(&sample());
        d.push(0);
        assert_eq!(decode(&d, 8), Err(DecodeError::TrailingBytes { extra: 1 }));
    }

    #[test]
    fn rejects_wrong_magic() {
        let mut d = datagram(&sample());
        d[0] = 0x42;
        assert_eq!(decode(&d, 8), Err(DecodeError::BadMagic(0x42)));
    }

    #[test]
    fn rejects_header_size_mismatch() {
        let mut d = datagram(&sample());
        d[1] = 8;
        assert_eq!(decode(&d, 8), Err(DecodeError::HeaderSizeMismatch(8)));
    }

    #[test]
    fn rejects_unknown_type_and_policy() {
        let mut d = datagram(&sample());
        d[2] = 0x91;
        assert_eq!(decode(&d, 8), Err(DecodeError::UnknownType(9)));
        d[2] = 0x07;
        assert_eq!(decode(&d, 8), Err(DecodeError::UnknownPolicy(7)));
    }

    #[test]
    fn rejects_zero_and_oversized_packet_count() {
        let mut d = datagram(&sample());
        d[6..8].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(decode(&d, 8), Err(DecodeError::ZeroPacketCount));
        d[6..8].copy_from_slice(&9u16.to_be_bytes());
        assert_eq!(decode(&d, 8), Err(DecodeError::PacketCountTooLarge { count: 9, max: 8 }));
    }

    #[test]
    fn rejects_packet_id_at_or_beyond_count() {
        let mut d = datagram(&sample());
        d[4..6].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(decode(&d, 8), Err(DecodeError::PacketIdOutOfRange { id: 1, count: 1 }));
    }

    #[test]
    fn rejects_inconsistent_or_unknown_flags() {
        let mut d = datagram(&Header { packet_id: 1, packet_count: 3, ..sample() });
        assert_eq!(d[3], 0);
        d[3] = FLAG_FIRST;
        assert_eq!(decode(&d, 8), Err(DecodeError::BadFlags(FLAG_FIRST)));
        d[3] = FLAG_LAST;
        assert_eq!(decode(&d, 8), Err(DecodeError::BadFlags(FLAG_LAST)));
        d[3] = 0x01;
        assert_eq!(decode(&d, 8), Err(DecodeError::BadFlags(0x01)));
        let mut single = datagram(&sample());
        single[3] = FLAG_FIRST;
        assert_eq!(decode(&single, 8), Err(DecodeError::BadFlags(FLAG_FIRST)));
    }

    #[test]
    fn leader_hint_round_trips_with_its_flag() {
        let d = datagram(&Header { flags: FLAG_LEADER_HINT, leader_hint: 2, ..sample() });
        assert_eq!(decode(&d, 8).unwrap().0.leader(), Some(2));
    }

    #[test]
    fn the_answered_span_round_trips_on_a_request_and_is_refused_elsewhere() {
        let mut h = Header { request_id: 70_000, ..sample() };
        h.set_answered_below(69_990);
        let d = datagram(&h);
        let back = decode(&d, 8).unwrap().0;
        assert_eq!((back.answered_below(), back.leader()), (Some(69_990), None));
        // Everything answered: the span is 0.
        let mut h = sample();
        h.set_answered_below(h.request_id);
        assert_eq!(decode(&datagram(&h), 8).unwrap().0.answered_below(), Some(7));
        // Across the id's wrap (the client's ids restart at 1 after u32::MAX).
        let mut h = Header { request_id: 3, ..sample() };
        h.set_answered_below(u32::MAX - 1);
        assert_eq!(decode(&datagram(&h), 8).unwrap().0.answered_below(), Some(u32::MAX - 1));
        // A span wider than 16 bits is not sent at all.
        let mut h = Header { request_id: 70_000, ..sample() };
        h.set_answered_below(1);
        assert_eq!((h.flags, decode(&datagram(&h), 8).unwrap().0.answered_below()), (0, None));
        // Not on a response, and not beside a leader hint.
        let mut d = datagram(&Header { message_type: MessageType::Response, ..sample() });
        d[3] |= FLAG_ANSWERED;
        assert_eq!(decode(&d, 8), Err(DecodeError::BadFlags(d[3])));
        let mut d = datagram(&Header { flags: FLAG_LEADER_HINT, ..sample() });
        d[3] |= FLAG_ANSWERED;
        assert_eq!(decode(&d, 8), Err(DecodeError::BadFlags(d[3])));
    }

    fn any_type() -> impl Strategy<Value = MessageType> {
        (0u8..5).prop_map(|b| MessageType::from_bits(b).unwrap())
    }
    fn any_policy() -> impl Strategy<Value = Policy> {
        (0u8..3).prop_map(|b| Policy::from_bits(b).unwrap())
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            message_type in any_type(), policy in any_policy(), hint in any::<bool>(),
            count in 1u16..=64, id_seed in any::<u16>(), client_id in any::<u64>(),
            request_id in any::<u32>(), leader_hint in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let packet_id = id_seed % count;
            let h = Header {
                message_type, policy, flags: if hint { FLAG_LEADER_HINT } else { 0 },
                packet_id, packet_count: count, client_id, request_id, leader_hint,
                payload_len: payload.len() as u16,
            };
            let mut d = datagram(&h);
            d[HEADER_SIZE..].copy_from_slice(&payload);
            let (back, p) = decode(&d, 64).unwrap();
            prop_assert_eq!(p, &payload[..]);
            prop_assert_eq!(back.message_type, h.message_type);
            prop_assert_eq!(back.policy, h.policy);
            prop_assert_eq!((back.packet_id, back.packet_count), (packet_id, count));
            prop_assert_eq!((back.client_id, back.request_id), (client_id, request_id));
            prop_assert_eq!(back.leader(), hint.then_some(leader_hint));
            prop_assert_eq!(back.flags & FLAG_FIRST != 0, packet_id == 0);
            prop_assert_eq!(back.flags & FLAG_LAST != 0, packet_id == count - 1);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes, 16);
        }
    }
}
