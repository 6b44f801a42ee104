//! Any byte string as a MAC'd R2P2 datagram: decoding and opening never
//! panic, a datagram that opens does so exactly once (the replay window),
//! and a refused one changes nothing (the next genuine datagram still
//! opens).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_auth::{Opener, Sealer, Secret};
use ordo_r2p2::auth::RAFT_LABEL;
use ordo_r2p2::header;

fuzz_target!(|data: &[u8]| {
    let key = Secret::from_bytes(b"fuzzing the sealed datagram path").unwrap().derive(RAFT_LABEL);
    let mut opener = Opener::for_peers(key.clone(), 4, 0);
    let context = 1u64.to_be_bytes();
    if let Ok((h, _payload)) = header::decode(data, 1024) {
        if opener.open(h.client_id, data, 0, &context).is_ok() {
            assert!(opener.open(h.client_id, data, 0, &context).is_err(), "opened twice");
        }
    }
    let mut genuine = data.to_vec();
    Sealer::new(key).seal(&mut genuine, u64::MAX / 2, &context);
    assert!(opener.open(0, &genuine, 0, &context).is_ok(), "a refusal changed the window");
});
