//! The RESP server's request path on arbitrary bytes: framing within the
//! bounds, then parsing into an action. Must never panic, never take more
//! bytes than it was given, never return more arguments than allowed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_kv::command::{Sizes, parse};
use ordo_kv::resp::{Limits, next_request};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_args: 64, max_request_bytes: 4096 };
    let sizes = Sizes { max_key_bytes: 64, max_value_bytes: 256 };
    let mut rest = data;
    while let Ok(Some((args, used))) = next_request(rest, &limits) {
        assert!(used > 0 && used <= rest.len());
        assert!(args.len() <= limits.max_args);
        let _ = parse(&args, &sizes);
        rest = &rest[used..];
    }
});
