//! Any byte string: `decode` never panics, and what it accepts re-encodes to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_r2p2::header::{self, HEADER_SIZE};

fuzz_target!(|data: &[u8]| {
    let Some((&max_byte, datagram)) = data.split_first() else { return };
    let max_packets = u16::from(max_byte).max(1);
    if let Ok((header, payload)) = header::decode(datagram, max_packets) {
        assert!(header.packet_count >= 1 && header.packet_count <= max_packets);
        assert!(header.packet_id < header.packet_count);
        assert_eq!(payload.len(), header.payload_len as usize);
        let mut again = vec![0u8; HEADER_SIZE];
        header::encode(&header, &mut again);
        again.extend_from_slice(payload);
        if header.flags & header::FLAG_AUTH != 0 {
            // The authentication trailer follows the payload, exactly.
            assert_eq!(datagram.len(), again.len() + ordo_auth::TRAILER_LEN);
            again.extend_from_slice(&datagram[again.len()..]);
        }
        assert_eq!(again, datagram);
    }
});
