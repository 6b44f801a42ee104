//! What the window-1 examples and `tests/urgent_path.rs` share: three
//! `AcuerdoDriver`s over the in-process loopback fabric, and their
//! election.

use ordo_acuerdo::{AcuerdoDriver, Config, Header, Layout, Role};
use ordo_fabric::loopback::{Loopback, loopback_group};

/// Three drivers (members 0, 1, 2) over the loopback fabric: heartbeats
/// every 1 ms, a peer dead after 20 ms of silence, elections after 30 ms;
/// durable mode as asked.
pub fn loopback_drivers(durable: bool) -> Vec<AcuerdoDriver<Loopback>> {
    let ids = vec![0u32, 1, 2];
    let len = Layout::new(&Config::new(ids.clone(), 0)).region_len;
    loopback_group(3, len)
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let mut c = Config::new(ids.clone(), i as u32);
            c.heartbeat_interval_ns = 1_000_000;
            c.heartbeat_timeout_ns = 20_000_000;
            c.election_timeout_ns = 30_000_000;
            c.durable = durable;
            AcuerdoDriver::new(f, c, 0, 1_000_000).expect("a valid configuration")
        })
        .collect()
}

/// Polls every driver, at the times `clock` gives, until one leads and
/// the others follow; returns the last time used.
pub fn elect(ds: &mut [AcuerdoDriver<Loopback>], mut clock: impl FnMut() -> u64) -> u64 {
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    for _ in 0..2_000_000 {
        let now = clock();
        for d in ds.iter_mut() {
            d.poll(now, &mut sink, &mut settled);
        }
        if ds.iter().filter(|d| d.engine().role() == Role::Leader).count() == 1
            && ds.iter().all(|d| d.engine().role() != Role::Electing)
        {
            return now;
        }
    }
    panic!("no leader elected");
}
