//! CPU cost of a vsync leader-only message at window 1, without threads
//! or a real fabric: three `VsyncDriver`s over the in-process loopback
//! fabric on one thread, member 0 the only sender; a message counts once
//! its sender delivers it. Prints ns per message, polls per message and ns
//! per poll; `counter` as the second argument turns stamped slots off. The
//! Acuerdo counterpart is `ordo-acuerdo`'s example of the same name.
//!
//! `cargo run --release -p ordo-vsync --example vsync_window1_loopback -- [MESSAGES] [counter]`

use ordo_fabric::loopback::loopback_group;
use ordo_vsync::{Delivered, DeliveryMode, GroupConfig, GroupLayout, SubgroupConfig, Switches, VsyncDriver};
use std::time::Instant;

fn main() {
    let iters: u64 = std::env::args().nth(1).map_or(1_000_000, |s| s.parse().unwrap());
    let stamped = std::env::args().nth(2).is_none_or(|s| s != "counter");
    let group = GroupConfig {
        members: vec![0, 1, 2],
        subgroups: vec![SubgroupConfig {
            name: String::new(),
            descriptor: Vec::new(),
            members: vec![0, 1, 2],
            senders: vec![0],
            window: 1,
            max_payload: 64,
            mode: DeliveryMode::Ordered,
        }],
        switches: Switches { stamped_slots: stamped, ..Switches::SPINDLE },
    };
    let len = GroupLayout::new(&group).region_len;
    let mut ds = Vec::new();
    let mut sender = None;
    for f in loopback_group(3, len) {
        let (d, s) = VsyncDriver::new(f, group.clone()).unwrap();
        if sender.is_none() {
            sender = s.into_iter().next().flatten();
        }
        ds.push(d);
    }
    let sender = sender.unwrap();
    let mut delivered_at_sender = 0u64;
    let mut polls = 0u64;
    let start = Instant::now();
    for k in 0..iters {
        loop {
            if sender.try_send_with(10, |b| b[..8].copy_from_slice(&k.to_le_bytes())).is_ok() {
                break;
            }
            for d in ds.iter_mut() {
                d.do_work(&mut |_: &[Delivered<'_>]| {});
                polls += 1;
            }
        }
        let want = k + 1;
        while delivered_at_sender < want {
            for (i, d) in ds.iter_mut().enumerate() {
                let mut n = 0;
                d.do_work(&mut |b: &[Delivered<'_>]| n += b.len() as u64);
                polls += 1;
                if i == 0 {
                    delivered_at_sender += n;
                }
            }
        }
    }
    let el = start.elapsed();
    println!(
        "{} ns/message at the sender, {:.2} polls/message, {} ns/poll (stamped {stamped})",
        el.as_nanos() as u64 / iters,
        polls as f64 / iters as f64,
        el.as_nanos() as u64 / polls
    );
}
