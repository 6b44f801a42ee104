//! Any byte string: the view-change decoder never panics, allocates only
//! within its bounds, and what it accepts re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_vsync::view::{ControlMsg, MAX_MEMBERS};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = ControlMsg::decode(data) {
        assert_eq!(msg.to_bytes(), data);
        if let ControlMsg::Commit { decision, .. } | ControlMsg::Accept { decision, .. } = &msg {
            assert!(!decision.next.members.is_empty() && decision.next.members.len() <= MAX_MEMBERS);
        }
    }
});
