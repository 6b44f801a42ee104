//! Server counters: every request, response and drop, by reason.
//!
//! Relaxed atomics. Every counter has one writer, the thread driving the
//! server's core (so a bump is a load and a store), except
//! `drop_remote_queue_full`, which workers bump too; [`Stats`] is a
//! snapshot (fields read one by one, so a snapshot taken under load is not
//! an atomic cut across counters).

use crate::header::DecodeError;
use crate::reassembly::ReassemblyStats;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// A snapshot of a server's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> Stats {
                Stats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Datagrams read from the socket.
    datagrams_received,
    /// Complete REQUEST messages (any policy).
    requests,
    /// REPLICATED_ROUTE requests handed to the replication hook.
    requests_replicated,
    /// Committed requests handed to the handler by the hook (`Apply`).
    committed_applied,
    /// RESPONSE messages handed to the socket (counted just before the
    /// send; a failed send is also counted in `drop_send_failed` or
    /// `drop_response_too_large`).
    responses_sent,
    /// REDIRECT messages handed to the socket.
    redirects_sent,
    /// ERROR messages handed to the socket (e.g. REPLICATED_ROUTE without a hook).
    errors_sent,
    /// Complete RAFT messages from peers.
    peer_messages_received,
    /// RAFT messages handed to the socket for peers.
    peer_messages_sent,
    /// Datagrams handed to the socket (all types; queued for the turn's
    /// `sendmmsg`: one the kernel then refuses is also counted in
    /// `drop_send_failed`).
    datagrams_sent,
    /// Drop: datagram shorter than its header or declared payload.
    drop_truncated,
    /// Drop: datagram longer than header + declared payload.
    drop_trailing_bytes,
    /// Drop: bad magic byte.
    drop_bad_magic,
    /// Drop: header size byte mismatch.
    drop_header_size,
    /// Drop: unknown message type.
    drop_unknown_type,
    /// Drop: unknown policy.
    drop_unknown_policy,
    /// Drop: bad or inconsistent flags.
    drop_bad_flags,
    /// Drop: packet count zero.
    drop_zero_packet_count,
    /// Drop: packet count above the bound.
    drop_packet_count_too_large,
    /// Drop: packet id not below packet count.
    drop_packet_id_out_of_range,
    /// Reassembly: duplicate datagrams ignored.
    drop_duplicate_packets,
    /// Reassembly: partial messages dropped for inconsistent fragments.
    drop_inconsistent,
    /// Reassembly: messages beyond `max_message_bytes`.
    drop_too_large,
    /// Reassembly: partial messages evicted by the bound on partials.
    drop_evicted,
    /// Reassembly: partial messages timed out.
    drop_timed_out,
    /// Requests dropped because every worker queue was full (the client retries).
    drop_queue_full,
    /// Messages of a type a server does not accept (RESPONSE, REDIRECT, ERROR,
    /// or RAFT without a hook).
    drop_unexpected_type,
    /// RAFT messages from an address not in `peers`, or actions naming an
    /// unknown peer.
    drop_unknown_peer,
    /// Drop: a datagram without the MAC its type requires (RAFT with a
    /// cluster secret, Admin always, requests when client MACs are required).
    drop_unauthenticated,
    /// Drop: a MAC that does not verify (forged, corrupted, wrong secret).
    drop_bad_mac,
    /// Drop: a MAC'd datagram whose counter was seen before or is stale.
    drop_replayed,
    /// Drop: a partial message evicted because its source held its
    /// per-source budget of partial messages or bytes.
    drop_source_budget,
    /// Handler answers to `respond: false` requests (followers, r3p2 §3.3).
    drop_follower_responses,
    /// Answers too large to split within `max_packets`.
    drop_response_too_large,
    /// Answers dropped because the remote-responder queue was full.
    drop_remote_queue_full,
    /// Datagrams the socket refused to send.
    drop_send_failed,
}

impl Stats {
    /// All drops by reason, summed.
    pub fn total_drops(&self) -> u64 {
        self.decode_drops()
            + self.drop_duplicate_packets
            + self.drop_inconsistent
            + self.drop_too_large
            + self.drop_evicted
            + self.drop_timed_out
            + self.drop_queue_full
            + self.drop_unexpected_type
            + self.drop_unknown_peer
            + self.drop_unauthenticated
            + self.drop_bad_mac
            + self.drop_replayed
            + self.drop_source_budget
            + self.drop_follower_responses
            + self.drop_response_too_large
            + self.drop_remote_queue_full
            + self.drop_send_failed
    }

    /// Datagrams rejected by header validation, summed.
    pub fn decode_drops(&self) -> u64 {
        self.drop_truncated
            + self.drop_trailing_bytes
            + self.drop_bad_magic
            + self.drop_header_size
            + self.drop_unknown_type
            + self.drop_unknown_policy
            + self.drop_bad_flags
            + self.drop_zero_packet_count
            + self.drop_packet_count_too_large
            + self.drop_packet_id_out_of_range
    }
}

impl Counters {
    /// Adds one to a counter only the core's thread writes (every counter
    /// but `drop_remote_queue_full`): a plain load and store, not a locked
    /// read-modify-write, since no other thread can add in between. Readers
    /// still see whole values.
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Adds one to a counter other threads write too (workers'
    /// `drop_remote_queue_full`).
    pub(crate) fn bump_shared(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn on_decode_error(&self, error: &DecodeError) {
        let counter = match error {
            DecodeError::Truncated { .. } => &self.drop_truncated,
            DecodeError::TrailingBytes { .. } => &self.drop_trailing_bytes,
            DecodeError::BadMagic(_) => &self.drop_bad_magic,
            DecodeError::HeaderSizeMismatch(_) => &self.drop_header_size,
            DecodeError::UnknownType(_) => &self.drop_unknown_type,
            DecodeError::UnknownPolicy(_) => &self.drop_unknown_policy,
            DecodeError::BadFlags(_) => &self.drop_bad_flags,
            DecodeError::ZeroPacketCount => &self.drop_zero_packet_count,
            DecodeError::PacketCountTooLarge { .. } => &self.drop_packet_count_too_large,
            DecodeError::PacketIdOutOfRange { .. } => &self.drop_packet_id_out_of_range,
        };
        Self::bump(counter);
    }

    pub(crate) fn mirror_reassembly(&self, stats: &ReassemblyStats) {
        self.drop_duplicate_packets.store(stats.duplicate_packets, Ordering::Relaxed);
        self.drop_inconsistent.store(stats.inconsistent_drops, Ordering::Relaxed);
        self.drop_too_large.store(stats.too_large_drops, Ordering::Relaxed);
        self.drop_evicted.store(stats.evicted_partials, Ordering::Relaxed);
        self.drop_timed_out.store(stats.timed_out_partials, Ordering::Relaxed);
        self.drop_source_budget.store(stats.source_budget_drops, Ordering::Relaxed);
    }
}
