//! A delivered message's sample envelope on arbitrary bytes: never a
//! panic, never a key or data slice outside the message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_dds::sample::Envelope;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Envelope::decode(data) {
        let _ = (e.key(data), e.data(data));
    }
});
