//! A delivered message's envelope and a snapshot for a joiner, on
//! arbitrary bytes: never a panic, never a state change on error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_dds::sample::Envelope;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Envelope::decode(data) {
        let _ = (e.key(data), e.data(data));
    }
});
