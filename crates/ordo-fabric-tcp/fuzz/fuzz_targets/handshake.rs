//! Any bytes as a peer's handshake (HELLO then PROOF) and first frame
//! header: decoding never panics, a decoded HELLO re-encodes to the same
//! bytes, and a proof made without the key never verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_auth::Secret;
use ordo_auth::handshake::{Role, verify};
use ordo_fabric_tcp::HANDSHAKE_KEY_LABEL;
use ordo_fabric_tcp::frame::{
    FrameHeader, HEADER_LEN, HELLO_FRAME_LEN, Hello, PROOF_FRAME_LEN, check_data_header, decode_proof,
};

fuzz_target!(|data: &[u8]| {
    let Some(hello) = data.get(..HELLO_FRAME_LEN) else { return };
    let hello: &[u8; HELLO_FRAME_LEN] = hello.try_into().unwrap();
    if let Ok(h) = Hello::decode(hello) {
        assert_eq!(&h.encode(), hello);
    }
    let rest = &data[HELLO_FRAME_LEN..];
    if let Some(proof) = rest.get(..PROOF_FRAME_LEN) {
        if let Ok(tag) = decode_proof(proof.try_into().unwrap()) {
            let key = Secret::from_bytes(b"a key the fuzzer does not hold").unwrap().derive(HANDSHAKE_KEY_LABEL);
            assert!(!verify(&key, Role::Dialer, hello, &[0u8; HELLO_FRAME_LEN], tag));
        }
        if let Some(header) = rest.get(PROOF_FRAME_LEN..PROOF_FRAME_LEN + HEADER_LEN) {
            let header = FrameHeader::decode(header.try_into().unwrap());
            let _ = check_data_header(&header, 1 << 20, 4096, 1);
        }
    }
});
