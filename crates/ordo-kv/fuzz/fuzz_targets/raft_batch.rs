//! Raft batches from arbitrary bytes (what the `kv.engine = "raft"`
//! handler decodes before applying anything): decoding never panics and
//! allocates no more than the input, and applying a decoded batch to a
//! state never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_kv::KvState;

fuzz_target!(|data: &[u8]| {
    if let Ok(items) = ordo_kv::raft::decode_batch(data) {
        assert!(items.len() <= data.len() / 5);
        let mut s = KvState::new();
        for e in items.iter().flatten() {
            let _ = s.apply(e);
        }
    }
});
