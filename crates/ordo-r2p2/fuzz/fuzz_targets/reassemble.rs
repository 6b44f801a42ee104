//! A stream of datagrams (each prefixed by a length byte, a source byte and
//! a time step): the reassembler never panics, never holds more partial
//! messages than its bound, and never yields a message beyond its byte bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_r2p2::header;
use ordo_r2p2::reassembly::{Reassembler, ReassemblyConfig};
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
    let config = ReassemblyConfig {
        max_message_bytes: 256,
        max_partial_messages: 4,
        max_packets: 16,
        timeout_ns: 1_000,
        max_partials_per_source: 2,
        max_partial_bytes_per_source: 1024,
        max_partial_bytes: 4096,
    };
    let mut reassembler = Reassembler::new(config);
    let mut now_ns = 0u64;
    let mut rest = data;
    while let [len, source, step, tail @ ..] = rest {
        let len = (*len as usize).min(tail.len());
        let (datagram, next) = tail.split_at(len);
        rest = next;
        now_ns += u64::from(*step) * 10;
        let from = SocketAddr::from(([127, 0, 0, 1], u16::from(*source % 4)));
        if let Ok((h, payload)) = header::decode(datagram, config.max_packets)
            && let Some(message) = reassembler.on_packet(from, &h, payload, now_ns)
        {
            assert!(message.payload.len() <= config.max_message_bytes);
        }
        if step % 7 == 0 {
            reassembler.expire(now_ns);
        }
        assert!(reassembler.partial_count() <= config.max_partial_messages);
    }
});
