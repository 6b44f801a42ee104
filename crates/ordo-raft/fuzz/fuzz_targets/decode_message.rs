//! Decodes arbitrary bytes as a Raft message: must never panic, never
//! allocate beyond the limits, and every accepted input must re-encode to
//! exactly the same bytes (the encoding is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_raft::{DecodeLimits, decode, decode_membership, encode, encode_membership};

fuzz_target!(|data: &[u8]| {
    let limits =
        DecodeLimits { max_entries: 64, max_entry_bytes: 4096, max_snapshot_bytes: 1 << 16, max_members: 16 };
    if let Ok(msg) = decode(data, &limits) {
        assert_eq!(msg.validate(&limits), Ok(()));
        let mut out = Vec::new();
        encode(&msg, &mut out);
        assert_eq!(out, data, "re-encoding differs");
        assert_eq!(decode(&out, &limits), Ok(msg));
    }
    if let Ok(membership) = decode_membership(data, &limits) {
        let mut out = Vec::new();
        encode_membership(&membership, &mut out);
        assert_eq!(out, data);
    }
});
