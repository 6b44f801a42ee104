//! Log entries and snapshots from arbitrary bytes: decoding never panics,
//! a decoded entry re-encodes to the same bytes, and applying it to a
//! state (or restoring a snapshot) never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_kv::{Entry, KvState};

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Entry::decode(data) {
        assert_eq!(e.encode(), data);
        let mut s = KvState::new();
        let _ = s.apply(&e);
    }
    let mut s = KvState::new();
    let _ = s.restore(data);
});
