use ordo_acuerdo::{AcuerdoDriver, Config, DeliverySink, Header, Role, Settled};
use ordo_fabric::loopback::loopback_group;
use std::time::Instant;
struct Sink;
impl DeliverySink for Sink {
    fn deliver(&mut self, _h: Header, _p: &[u8]) {}
}
fn main() {
    let ids = vec![0u32, 1, 2];
    let cfg0 = Config::new(ids.clone(), 0);
    let len = ordo_acuerdo::Layout::new(&cfg0).region_len;
    let mut ds: Vec<_> = loopback_group(3, len)
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let mut c = Config::new(ids.clone(), i as u32);
            c.heartbeat_interval_ns = 1_000_000;
            c.heartbeat_timeout_ns = 20_000_000;
            c.election_timeout_ns = 30_000_000;
            AcuerdoDriver::new(f, c, 0, 1_000_000).unwrap()
        })
        .collect();
    let mut settled = Vec::new();
    let t0 = Instant::now();
    let mut fake = 0u64;
    let leader = loop {
        fake += 1000;
        for d in ds.iter_mut() {
            d.on_fabric_events(fake, |_| {});
            if d.can_poll() {
                d.poll(fake, &mut Sink, &mut settled);
            } else {
                d.post_backlog();
            }
        }
        if let Some(l) = ds.iter().position(|d| d.engine().role() == Role::Leader) {
            break l;
        }
    };
    let _ = t0;
    let mode = std::env::args().nth(1).unwrap_or_default();
    let n = 500_000u64;
    let start = Instant::now();
    let mut polls = 0u64;
    // A fake clock advancing 100 ns per poll: no clock reads in the loop.
    if mode == "idle" {
        for _ in 0..n {
            fake += 100;
            let d = &mut ds[(leader + 1) % 3];
            d.poll(fake, &mut Sink, &mut settled);
            polls += 1;
        }
    } else {
        for t in 0..n {
            ds[leader].submit(t, &[0x5a; 10]).unwrap();
            'op: loop {
                for i in 0..3 {
                    settled.clear();
                    fake += 100;
                    let d = &mut ds[(leader + i) % 3];
                    d.on_fabric_events(fake, |_| {});
                    if d.can_poll() {
                        d.poll(fake, &mut Sink, &mut settled);
                        polls += 1;
                    } else {
                        d.post_backlog();
                    }
                    if settled.iter().any(|s| matches!(s, Settled::Committed { ticket, .. } if *ticket == t))
                    {
                        break 'op;
                    }
                }
            }
        }
    }
    let el = start.elapsed().as_nanos() as f64;
    println!(
        "{mode}: {:.0} ns per op, {:.2} polls per op, {:.0} ns per poll",
        el / n as f64,
        polls as f64 / n as f64,
        el / polls as f64
    );
}
