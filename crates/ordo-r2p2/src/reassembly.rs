//! Splitting messages into datagrams and putting them back together (sans-I/O).
//!
//! # Invariants
//! - A message is identified by [`MessageKey`] = (source address, client id,
//!   request id, message type). Its datagrams may arrive in any order; a
//!   datagram seen twice is ignored (counted in `duplicate_packets`).
//! - Bounded memory, whatever peers claim: at most `max_partial_messages`
//!   incomplete messages are held, each with at most `max_packets` fragment
//!   slots (the decode bound) and at most `max_message_bytes` payload bytes.
//! - **Bounded per source.** A partial message is charged its slot table
//!   and the bytes it holds to its source address (ip:port); one source
//!   holds at most `max_partials_per_source` partial messages and
//!   `max_partial_bytes_per_source` charged bytes, and all sources together
//!   at most `max_partial_bytes`. Beyond a source's budget that source's
//!   oldest partial goes (counted in `source_budget_drops`), beyond the
//!   global bounds the oldest of all (`evicted_partials`): a stranger's
//!   never-finished fragments cannot hold memory past its budget, nor push
//!   out more than the oldest partials of others.
//!   Fragment storage grows only with bytes actually received, so a header
//!   that lies about sizes costs at most one slot table of `packet_count`
//!   (≤ `max_packets`) empty entries.
//! - Every discarded datagram or partial message increments exactly one
//!   named counter in [`ReassemblyStats`].
//! - Time is an input (`now_ns`); nothing here reads a clock or does I/O.
//!   Incomplete messages older than `timeout_ns` are dropped by
//!   [`Reassembler::expire`].
//! - Single-datagram messages (the common case) never touch the table.

use crate::header::{self, HEADER_SIZE, Header, MessageType, Policy};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

/// Bounds for a [`Reassembler`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReassemblyConfig {
    /// Largest message payload accepted, in bytes.
    pub max_message_bytes: usize,
    /// Most incomplete messages held at once; the oldest is evicted beyond it.
    pub max_partial_messages: usize,
    /// Most datagrams per message (the header decode bound).
    pub max_packets: u16,
    /// An incomplete message older than this is dropped by `expire`.
    pub timeout_ns: u64,
    /// Most incomplete messages one source address holds.
    pub max_partials_per_source: usize,
    /// Most bytes (slot tables and fragments) one source's incomplete
    /// messages are charged.
    pub max_partial_bytes_per_source: usize,
    /// Most bytes all incomplete messages are charged together.
    pub max_partial_bytes: usize,
}

impl Default for ReassemblyConfig {
    fn default() -> Self {
        ReassemblyConfig {
            max_message_bytes: 1 << 20,
            max_partial_messages: 1024,
            max_packets: 1024,
            timeout_ns: 500_000_000,
            max_partials_per_source: 16,
            max_partial_bytes_per_source: 2 << 20,
            max_partial_bytes: 64 << 20,
        }
    }
}

/// Identifies one message being reassembled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MessageKey {
    /// Who sent the datagrams.
    pub from: SocketAddr,
    /// Header client id.
    pub client_id: u64,
    /// Header request id.
    pub request_id: u32,
    /// Header message type.
    pub message_type: MessageType,
}

/// A complete message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who sent it.
    pub from: SocketAddr,
    /// Its type.
    pub message_type: MessageType,
    /// Its policy.
    pub policy: Policy,
    /// Sender's client id.
    pub client_id: u64,
    /// Sender's request id.
    pub request_id: u32,
    /// Leader hint of the last datagram, if flagged.
    pub leader_hint: Option<u16>,
    /// A request's lowest id that its client may not have had answered
    /// yet, from the last datagram ([`Header::answered_below`]), if flagged.
    pub answered_below: Option<u32>,
    /// The reassembled payload.
    pub payload: Vec<u8>,
}

/// Counters of a [`Reassembler`]; every drop has its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Datagrams offered.
    pub packets: u64,
    /// Messages completed.
    pub messages: u64,
    /// Datagrams ignored because their fragment was already held.
    pub duplicate_packets: u64,
    /// Partial messages dropped because a datagram disagreed on packet
    /// count or policy with the ones before it.
    pub inconsistent_drops: u64,
    /// Messages dropped for exceeding `max_message_bytes`.
    pub too_large_drops: u64,
    /// Partial messages evicted because `max_partial_messages` were held.
    pub evicted_partials: u64,
    /// Partial messages dropped by `expire` after `timeout_ns`.
    pub timed_out_partials: u64,
    /// Partial messages dropped because their source was over its budget.
    pub source_budget_drops: u64,
}

impl ReassemblyStats {
    /// The sum of two reassemblers' counters.
    pub fn plus(&self, o: &ReassemblyStats) -> ReassemblyStats {
        ReassemblyStats {
            packets: self.packets + o.packets,
            messages: self.messages + o.messages,
            duplicate_packets: self.duplicate_packets + o.duplicate_packets,
            inconsistent_drops: self.inconsistent_drops + o.inconsistent_drops,
            too_large_drops: self.too_large_drops + o.too_large_drops,
            evicted_partials: self.evicted_partials + o.evicted_partials,
            timed_out_partials: self.timed_out_partials + o.timed_out_partials,
            source_budget_drops: self.source_budget_drops + o.source_budget_drops,
        }
    }
}

/// What one source's incomplete messages hold, oldest first.
#[derive(Debug, Default)]
struct SourceUse {
    bytes: usize,
    /// Its partial messages by insertion sequence number.
    order: BTreeMap<u64, MessageKey>,
}

struct Partial {
    policy: Policy,
    packet_count: u16,
    first_seen_ns: u64,
    /// Insertion sequence number: eviction order.
    seq: u64,
    received: u16,
    bytes: usize,
    fragments: Vec<Option<Vec<u8>>>,
    leader_hint: Option<u16>,
    answered_below: Option<u32>,
}

/// Reassembles datagrams into messages within fixed bounds.
pub struct Reassembler {
    config: ReassemblyConfig,
    partials: HashMap<MessageKey, Partial>,
    sources: HashMap<SocketAddr, SourceUse>,
    /// Every partial message by insertion sequence number: eviction order,
    /// found without scanning the table (evictions happen under attack).
    order: BTreeMap<u64, MessageKey>,
    charged_bytes: usize,
    next_seq: u64,
    stats: ReassemblyStats,
}

/// Bytes a partial message is charged: its slot table and its fragments.
fn charge(packet_count: u16, bytes: usize) -> usize {
    packet_count as usize * std::mem::size_of::<Option<Vec<u8>>>() + bytes
}

impl Reassembler {
    /// An empty reassembler with these bounds.
    pub fn new(config: ReassemblyConfig) -> Self {
        assert!(
            config.max_partial_messages > 0
                && config.max_packets > 0
                && config.max_partials_per_source > 0
                && config.max_partial_bytes_per_source > 0
                && config.max_partial_bytes > 0,
            "reassembly bounds must be positive"
        );
        Reassembler {
            config,
            partials: HashMap::with_capacity(config.max_partial_messages.min(4096)),
            sources: HashMap::new(),
            order: BTreeMap::new(),
            charged_bytes: 0,
            next_seq: 0,
            stats: ReassemblyStats::default(),
        }
    }

    /// The bounds.
    pub fn config(&self) -> &ReassemblyConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Incomplete messages currently held.
    pub fn partial_count(&self) -> usize {
        self.partials.len()
    }

    /// Bytes charged to incomplete messages (slot tables and fragments):
    /// all of them, and those of `source`.
    pub fn charged_bytes(&self, source: Option<SocketAddr>) -> usize {
        match source {
            None => self.charged_bytes,
            Some(s) => self.sources.get(&s).map_or(0, |u| u.bytes),
        }
    }

    /// Incomplete messages held for `source`.
    pub fn partials_of(&self, source: SocketAddr) -> usize {
        self.sources.get(&source).map_or(0, |u| u.order.len())
    }

    fn uncharge(&mut self, key: &MessageKey) -> Option<Partial> {
        let partial = self.partials.remove(key)?;
        let c = charge(partial.packet_count, partial.bytes);
        self.charged_bytes -= c;
        self.order.remove(&partial.seq);
        if let Some(u) = self.sources.get_mut(&key.from) {
            u.order.remove(&partial.seq);
            u.bytes -= c;
            if u.order.is_empty() {
                debug_assert_eq!(u.bytes, 0);
                self.sources.remove(&key.from);
            }
        }
        Some(partial)
    }

    fn add_bytes(&mut self, key: &MessageKey, bytes: usize) {
        self.charged_bytes += bytes;
        self.sources.get_mut(&key.from).expect("a held partial's source is charged").bytes += bytes;
        self.partials.get_mut(key).expect("held").bytes += bytes;
    }

    /// The oldest partial of `source` (or of all), except `keep`.
    fn oldest(&self, source: Option<SocketAddr>, keep: &MessageKey) -> Option<MessageKey> {
        let order = match source {
            Some(s) => &self.sources.get(&s)?.order,
            None => &self.order,
        };
        order.values().find(|k| *k != keep).copied()
    }

    /// Makes room for `extra` charged bytes (and, `new_partial`, one more
    /// partial) for `key`'s source and in all, evicting oldest-first;
    /// false if even that cannot make room (then `key`'s own partial must go).
    fn make_room(&mut self, key: &MessageKey, extra: usize, new_partial: bool) -> bool {
        let c = self.config;
        loop {
            let (partials, bytes) = self.sources.get(&key.from).map_or((0, 0), |u| (u.order.len(), u.bytes));
            let over_count = new_partial && partials >= c.max_partials_per_source;
            if !over_count && bytes + extra <= c.max_partial_bytes_per_source {
                break;
            }
            match self.oldest(Some(key.from), key) {
                Some(victim) => {
                    self.uncharge(&victim);
                    self.stats.source_budget_drops += 1;
                }
                None => return false,
            }
        }
        loop {
            let over_count = new_partial && self.partials.len() >= c.max_partial_messages;
            if !over_count && self.charged_bytes + extra <= c.max_partial_bytes {
                return true;
            }
            match self.oldest(None, key) {
                Some(victim) => {
                    self.uncharge(&victim);
                    self.stats.evicted_partials += 1;
                }
                None => return false,
            }
        }
    }

    /// Offers one decoded datagram; returns the message it completes, if any.
    pub fn on_packet(
        &mut self,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
        now_ns: u64,
    ) -> Option<Message> {
        self.stats.packets += 1;
        debug_assert!(header.packet_id < header.packet_count);
        if header.packet_count == 1 {
            if payload.len() > self.config.max_message_bytes {
                self.stats.too_large_drops += 1;
                return None;
            }
            self.stats.messages += 1;
            return Some(Message {
                from,
                message_type: header.message_type,
                policy: header.policy,
                client_id: header.client_id,
                request_id: header.request_id,
                leader_hint: header.leader(),
                answered_below: header.answered_below(),
                payload: payload.to_vec(),
            });
        }
        if header.packet_count > self.config.max_packets {
            // The decoder enforces this too; a caller decoding with a larger
            // bound still cannot make us allocate beyond ours.
            self.stats.inconsistent_drops += 1;
            return None;
        }
        let key = MessageKey {
            from,
            client_id: header.client_id,
            request_id: header.request_id,
            message_type: header.message_type,
        };
        if !self.partials.contains_key(&key) {
            if payload.len() > self.config.max_message_bytes {
                self.stats.too_large_drops += 1;
                return None;
            }
            let table = charge(header.packet_count, 0);
            if !self.make_room(&key, table, true) {
                self.stats.source_budget_drops += 1;
                return None;
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.partials.insert(
                key,
                Partial {
                    policy: header.policy,
                    packet_count: header.packet_count,
                    first_seen_ns: now_ns,
                    seq,
                    received: 0,
                    bytes: 0,
                    fragments: vec![None; header.packet_count as usize],
                    leader_hint: None,
                    answered_below: None,
                },
            );
            self.charged_bytes += table;
            self.order.insert(seq, key);
            let u = self.sources.entry(from).or_default();
            u.order.insert(seq, key);
            u.bytes += table;
        }
        let partial = self.partials.get_mut(&key).expect("inserted above");
        if partial.packet_count != header.packet_count || partial.policy != header.policy {
            self.uncharge(&key);
            self.stats.inconsistent_drops += 1;
            return None;
        }
        if partial.fragments[header.packet_id as usize].is_some() {
            self.stats.duplicate_packets += 1;
            return None;
        }
        if partial.bytes + payload.len() > self.config.max_message_bytes {
            self.uncharge(&key);
            self.stats.too_large_drops += 1;
            return None;
        }
        if !self.make_room(&key, payload.len(), false) {
            self.uncharge(&key);
            self.stats.source_budget_drops += 1;
            return None;
        }
        self.add_bytes(&key, payload.len());
        let partial = self.partials.get_mut(&key).expect("held");
        partial.fragments[header.packet_id as usize] = Some(payload.to_vec());
        partial.received += 1;
        if header.packet_id == header.packet_count - 1 {
            partial.leader_hint = header.leader();
            partial.answered_below = header.answered_below();
        }
        if partial.received < partial.packet_count {
            return None;
        }
        let partial = self.uncharge(&key).expect("present");
        let mut payload = Vec::with_capacity(partial.bytes);
        for fragment in partial.fragments {
            payload.extend_from_slice(&fragment.expect("all fragments received"));
        }
        self.stats.messages += 1;
        Some(Message {
            from,
            message_type: key.message_type,
            policy: partial.policy,
            client_id: key.client_id,
            request_id: key.request_id,
            leader_hint: partial.leader_hint,
            answered_below: partial.answered_below,
            payload,
        })
    }

    /// Drops incomplete messages first seen at or before `now_ns - timeout_ns`;
    /// returns how many.
    pub fn expire(&mut self, now_ns: u64) -> usize {
        let timeout_ns = self.config.timeout_ns;
        let expired: Vec<MessageKey> = self
            .partials
            .iter()
            .filter(|(_, p)| now_ns.saturating_sub(p.first_seen_ns) >= timeout_ns)
            .map(|(k, _)| *k)
            .collect();
        for key in &expired {
            self.uncharge(key);
        }
        self.stats.timed_out_partials += expired.len() as u64;
        if self.partials.is_empty() {
            // Give back what a burst grew the tables to.
            debug_assert!(self.order.is_empty() && self.sources.is_empty());
            self.partials.shrink_to(self.config.max_partial_messages.min(64));
            self.sources.shrink_to(64);
        }
        expired.len()
    }
}

/// How many datagrams a payload of `len` bytes needs with `mtu_payload`
/// payload bytes per datagram (at least one, also for an empty payload).
pub fn packet_count_for(len: usize, mtu_payload: usize) -> usize {
    assert!(mtu_payload > 0, "mtu_payload must be positive");
    len.div_ceil(mtu_payload).max(1)
}

/// Error of [`split`]: the message needs more datagrams than allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("message of {len} bytes needs {packets} datagrams, more than {max}")]
pub struct TooLarge {
    /// Payload length.
    pub len: usize,
    /// Datagrams needed.
    pub packets: usize,
    /// Allowed.
    pub max: usize,
}

/// Splits `payload` into datagrams of at most `mtu_payload` payload bytes,
/// each with a copy of `template` (its packet id/count/payload_len are set
/// here), and calls `emit` with each encoded datagram in order (which may
/// append to it: an authentication trailer). `scratch` is reused between
/// datagrams.
pub fn split(
    template: &Header,
    payload: &[u8],
    mtu_payload: usize,
    max_packets: u16,
    scratch: &mut Vec<u8>,
    mut emit: impl FnMut(&mut Vec<u8>),
) -> Result<(), TooLarge> {
    let mtu_payload = mtu_payload.min(header::MAX_DATAGRAM - HEADER_SIZE).min(u16::MAX as usize);
    let packets = packet_count_for(payload.len(), mtu_payload);
    if packets > max_packets as usize {
        return Err(TooLarge { len: payload.len(), packets, max: max_packets as usize });
    }
    let mut chunks = payload.chunks(mtu_payload);
    for packet_id in 0..packets {
        let chunk = chunks.next().unwrap_or(&[]);
        let header = Header {
            packet_id: packet_id as u16,
            packet_count: packets as u16,
            payload_len: chunk.len() as u16,
            ..*template
        };
        scratch.clear();
        scratch.resize(HEADER_SIZE, 0);
        header::encode(&header, scratch);
        scratch.extend_from_slice(chunk);
        emit(scratch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::decode;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn template(request_id: u32) -> Header {
        Header {
            message_type: MessageType::Request,
            policy: Policy::FixedRoute,
            flags: 0,
            packet_id: 0,
            packet_count: 1,
            client_id: 9,
            request_id,
            leader_hint: 0,
            payload_len: 0,
        }
    }

    fn datagrams(request_id: u32, payload: &[u8], mtu: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        split(&template(request_id), payload, mtu, 64, &mut Vec::new(), |d| out.push(d.to_vec())).unwrap();
        out
    }

    fn config() -> ReassemblyConfig {
        ReassemblyConfig {
            max_message_bytes: 1000,
            max_partial_messages: 2,
            max_packets: 64,
            timeout_ns: 100,
            ..ReassemblyConfig::default()
        }
    }

    fn offer(r: &mut Reassembler, from: u16, d: &[u8], now: u64) -> Option<Message> {
        let (h, p) = decode(d, 64).unwrap();
        r.on_packet(addr(from), &h, p, now)
    }

    #[test]
    fn split_sizes_and_empty_payload() {
        assert_eq!(datagrams(1, &[], 10).len(), 1);
        assert_eq!(datagrams(1, &[0; 10], 10).len(), 1);
        assert_eq!(datagrams(1, &[0; 11], 10).len(), 2);
        let err = split(&template(1), &[0; 100], 10, 5, &mut Vec::new(), |_| {}).unwrap_err();
        assert_eq!(err.packets, 10);
    }

    #[test]
    fn out_of_order_with_duplicates_reassembles_once() {
        let payload: Vec<u8> = (0..95u8).collect();
        let mut ds = datagrams(1, &payload, 10);
        ds.reverse();
        let mut r = Reassembler::new(config());
        let mut done = Vec::new();
        for (i, d) in ds.iter().enumerate() {
            if let Some(m) = offer(&mut r, 1, d, 0) {
                done.push(m);
            }
            if i == 3 {
                assert!(offer(&mut r, 1, d, 0).is_none());
            }
        }
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].payload, payload);
        assert_eq!(r.stats().duplicate_packets, 1);
        assert_eq!(r.partial_count(), 0);
        // A late duplicate after completion starts a new partial that times out.
        assert!(offer(&mut r, 1, &ds[0], 0).is_none());
        assert_eq!(r.expire(1000), 1);
        assert_eq!(r.stats().timed_out_partials, 1);
    }

    #[test]
    fn same_request_from_different_sources_kept_apart() {
        let ds = datagrams(1, &[7; 25], 10);
        let mut r = Reassembler::new(config());
        assert!(offer(&mut r, 1, &ds[0], 0).is_none());
        assert!(offer(&mut r, 2, &ds[1], 0).is_none());
        assert_eq!(r.partial_count(), 2);
    }

    #[test]
    fn inconsistent_packet_count_drops_partial() {
        let a = datagrams(1, &[1; 25], 10); // 3 packets
        let b = datagrams(1, &[1; 45], 10); // 5 packets, same key
        let mut r = Reassembler::new(config());
        assert!(offer(&mut r, 1, &a[0], 0).is_none());
        assert!(offer(&mut r, 1, &b[1], 0).is_none());
        assert_eq!(r.stats().inconsistent_drops, 1);
        assert_eq!(r.partial_count(), 0);
    }

    #[test]
    fn lies_about_length_are_bounded() {
        let mut r = Reassembler::new(config());
        // 64 packets of 20 bytes = 1280 > 1000: dropped once the bytes exceed.
        let ds = datagrams(1, &[3; 64 * 20], 20);
        let mut got = None;
        for d in &ds {
            got = got.or(offer(&mut r, 1, d, 0));
        }
        assert!(got.is_none());
        assert_eq!(r.stats().too_large_drops, 1);
        // A single oversized datagram is dropped outright.
        let one = datagrams(2, &[3; 1001], 2000);
        assert!(offer(&mut r, 1, &one[0], 0).is_none());
        assert_eq!(r.stats().too_large_drops, 2);
    }

    #[test]
    fn bound_on_partials_evicts_oldest() {
        let mut r = Reassembler::new(config());
        for request_id in 0..3 {
            let ds = datagrams(request_id, &[5; 30], 10);
            assert!(offer(&mut r, 1, &ds[0], request_id as u64).is_none());
        }
        assert_eq!(r.partial_count(), 2);
        assert_eq!(r.stats().evicted_partials, 1);
        // Request 0 was evicted: its remaining fragments start over and never complete.
        let ds = datagrams(0, &[5; 30], 10);
        assert!(offer(&mut r, 1, &ds[1], 5).is_none());
        assert_eq!(r.stats().evicted_partials, 2);
        // Request 2 is intact.
        let ds = datagrams(2, &[5; 30], 10);
        assert!(offer(&mut r, 1, &ds[1], 5).is_none());
        assert_eq!(offer(&mut r, 1, &ds[2], 5).unwrap().payload, vec![5; 30]);
    }

    proptest::proptest! {
        /// Whatever datagrams arrive (valid headers, arbitrary numbering,
        /// sources and times), the table stays within its bounds and every
        /// completed message within the byte bound.
        #[test]
        fn arbitrary_streams_stay_within_bounds(
            packets in proptest::collection::vec(
                (0u16..4, 0u32..6, 1u16..8, 0u16..8, 0usize..300, 0u64..50), 0..200),
        ) {
            let bounds = ReassemblyConfig {
                max_partial_messages: 6,
                max_partials_per_source: 2,
                max_partial_bytes_per_source: 700,
                max_partial_bytes: 1500,
                ..config()
            };
            let mut r = Reassembler::new(bounds);
            let mut now = 0;
            for (source, request_id, count, id_seed, len, step) in packets {
                now += step;
                let header = Header { packet_id: id_seed % count, packet_count: count, payload_len: len as u16,
                    ..template(request_id) };
                if let Some(m) = r.on_packet(addr(source), &header, &vec![1u8; len], now) {
                    proptest::prop_assert!(m.payload.len() <= bounds.max_message_bytes);
                }
                if step == 0 {
                    r.expire(now);
                }
                proptest::prop_assert!(r.partial_count() <= bounds.max_partial_messages);
                proptest::prop_assert!(r.charged_bytes(None) <= bounds.max_partial_bytes);
                for s in 0..4 {
                    proptest::prop_assert!(r.partials_of(addr(s)) <= bounds.max_partials_per_source);
                    proptest::prop_assert!(r.charged_bytes(Some(addr(s))) <= bounds.max_partial_bytes_per_source);
                }
                let sum: usize = (0..4).map(|s| r.charged_bytes(Some(addr(s)))).sum();
                proptest::prop_assert_eq!(sum, r.charged_bytes(None));
                let held: usize = (0..4).map(|s| r.partials_of(addr(s))).sum();
                proptest::prop_assert_eq!(held, r.partial_count());
            }
        }
    }

    #[test]
    fn one_source_flooding_fragments_holds_only_its_budget_and_others_complete() {
        let config = ReassemblyConfig { max_partial_messages: 1024, ..ReassemblyConfig::default() };
        let mut r = Reassembler::new(config);
        let flooder = addr(1);
        for request_id in 0..1333u32 {
            let header =
                Header { packet_id: 0, packet_count: 1024, payload_len: 100, ..template(request_id) };
            assert!(r.on_packet(flooder, &header, &[0; 100], 0).is_none());
            assert!(r.partials_of(flooder) <= config.max_partials_per_source);
            assert!(r.charged_bytes(Some(flooder)) <= config.max_partial_bytes_per_source);
        }
        assert_eq!(r.stats().source_budget_drops, 1333 - config.max_partials_per_source as u64);
        assert_eq!(r.stats().evicted_partials, 0, "no one else's partial was pushed out");
        // An honest client's two-datagram message completes meanwhile.
        let honest = datagrams(7, &[5; 30], 20);
        assert!(offer(&mut r, 2, &honest[0], 1).is_none());
        let m = offer(&mut r, 2, &honest[1], 1).expect("completes");
        assert_eq!(m.payload, vec![5; 30]);
        // Expiry gives the flooder's memory back.
        r.expire(config.timeout_ns + 1);
        assert_eq!((r.partial_count(), r.charged_bytes(None)), (0, 0));
    }

    #[test]
    fn timeout_drops_only_old_partials() {
        let mut r = Reassembler::new(config());
        let a = datagrams(1, &[1; 25], 10);
        let b = datagrams(2, &[1; 25], 10);
        assert!(offer(&mut r, 1, &a[0], 0).is_none());
        assert!(offer(&mut r, 1, &b[0], 80).is_none());
        assert_eq!(r.expire(150), 1);
        assert_eq!(r.partial_count(), 1);
        assert!(offer(&mut r, 1, &b[1], 150).is_none());
        assert!(offer(&mut r, 1, &b[2], 150).is_some());
    }
}
