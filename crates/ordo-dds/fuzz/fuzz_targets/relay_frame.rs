//! The relay's decoder on arbitrary bytes: a frame never panics, never
//! reads past its length, and what decodes re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_dds::wire::{Frame, read_frame};

fuzz_target!(|data: &[u8]| {
    if let Ok(Ok(f)) = read_frame(&mut &data[..], 1 << 16) {
        let again = f.to_bytes();
        let len = u32::from_le_bytes(again[..4].try_into().unwrap()) as usize;
        assert_eq!(Frame::decode(&again[4..4 + len]), Ok(f));
    }
    let _ = Frame::decode(data);
});
