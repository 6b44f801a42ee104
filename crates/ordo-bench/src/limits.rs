//! Physical limits, measured in the same run as the figures they bound.
//!
//! A hot single-thread `memcpy` is not what bounds a transfer between two
//! cores: there every cache line has to migrate from the writer's core to
//! the reader's. So the streaming limit here is a **cross-process copy
//! ring** of the same geometry as the fabric's streaming test: two
//! processes (pinned to different cores where there are two), one shared
//! mapping; the writer copies each `size`-byte message into the next free
//! slot and publishes a batch with one counter store; the reader, seeing
//! the counter, reads every byte of every new message (a checksum over its
//! words, with the message's number checked in its first word) and
//! acknowledges. Nothing else happens on either side: no fabric, no
//! protocol, no validation beyond the checksum.
//!
//! For UDP the limit is a **busy-polled loopback round trip** with plain
//! non-blocking sockets, client and server each spinning on `recv` on its
//! own thread: what R3P2's request path could cost at best here. Measured
//! back to back, and spaced as a light load's requests are
//! ([`Spacing::Poisson`]): on some VMs a round trip after 2 ms of spinning
//! costs several times one right after another (a 2-vCPU Intel VM, both
//! threads pinned and spinning: p50 3.4 µs back to back, 10.5 µs 0.5 ms
//! apart, 20.2 µs 2 ms apart), so light-load latency is read against the
//! round trip at its own spacing as well.
//!
//! # Invariants
//! - The copy ring's reader touches every byte of every message it counts
//!   (checked: a wrong first word is an error, not a figure).
//! - Both limits wait with deadlines: a peer that stops answering is an
//!   error after 60 s, never a hang.

use crate::peer::PeerChild;
use hdrhistogram::Histogram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SEQ: usize = 0;
const ACK: usize = 64;
const STOP: usize = 128;
const SIZE: usize = 192;
const SLOTS: usize = 200;
const CHECKSUM: usize = 256;
const RING: usize = 4096;
const DEADLINE: Duration = Duration::from_secs(60);

struct Shared {
    map: memmap2::MmapRaw,
}

impl Shared {
    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at + 8 <= RING && at.is_multiple_of(8));
        // SAFETY: in bounds of the mapping (at least RING bytes), 8-aligned
        // (the mapping is page-aligned); the other process uses the same
        // words atomically.
        unsafe { &*(self.map.as_mut_ptr().add(at) as *const AtomicU64) }
    }

    fn slot(&self, i: usize, size: usize) -> *mut u8 {
        // SAFETY: the caller passes i < slots; the file is RING + slots*size.
        unsafe { self.map.as_mut_ptr().add(RING + i * size) }
    }
}

fn open(path: &Path, len: Option<usize>) -> Result<Shared, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(len.is_some())
        .truncate(len.is_some())
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(len) = len {
        file.set_len(len as u64).map_err(|e| e.to_string())?;
    }
    let map = memmap2::MmapOptions::new().map_raw(&file).map_err(|e| e.to_string())?;
    if map.len() < RING {
        return Err(format!("{}: too short for a copy ring", path.display()));
    }
    Ok(Shared { map })
}

fn wait(what: &str, mut ready: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + DEADLINE;
    let mut spins = 0u32;
    while !ready() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) && Instant::now() > deadline {
            return Err(format!("copy ring: {what} within {DEADLINE:?}"));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// The cross-process copy ring's bandwidth (bytes/s) for `size`-byte
/// messages in `slots` slots, streamed for about `time`; the reader is
/// `exe fabric-peer --role copyring`, on core 1 when `pinned` (the caller
/// is then on core 0).
pub fn copy_ring(exe: &Path, size: usize, slots: usize, time: Duration, pinned: bool) -> Result<f64, String> {
    assert!(size >= 8 && size.is_multiple_of(8) && slots >= 1);
    let path = PathBuf::from("/dev/shm").join(format!("ordo-copyring-{}-{size}", std::process::id()));
    let ring = open(&path, Some(RING + slots * size))?;
    ring.word(SIZE).store(size as u64, Ordering::Relaxed);
    ring.word(SLOTS).store(slots as u64, Ordering::Release);
    let mut cmd = Command::new(exe);
    cmd.args(["fabric-peer", "--role", "copyring", "--path"]).arg(&path);
    if pinned {
        cmd.args(["--core", "1"]);
    }
    let child = PeerChild { child: cmd.spawn().map_err(|e| e.to_string())?, listen: None };
    let result = (|| -> Result<f64, String> {
        let mut src = vec![0x5Au8; size];
        let (mut sent, start) = (0u64, Instant::now());
        let mut measured_from = None;
        let mut checks = 0u32;
        loop {
            let acked = ring.word(ACK).load(Ordering::Acquire);
            let free = slots as u64 - (sent - acked);
            if free == 0 {
                wait("the reader acknowledges", || ring.word(ACK).load(Ordering::Acquire) > acked)?;
                continue;
            }
            for m in sent + 1..=sent + free {
                src[..8].copy_from_slice(&m.to_le_bytes());
                // SAFETY: slot in bounds; src and the mapping are distinct.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), ring.slot(m as usize % slots, size), size)
                };
            }
            sent += free;
            ring.word(SEQ).store(sent, Ordering::Release);
            checks += 1;
            if checks.is_multiple_of(16) {
                let elapsed = start.elapsed();
                // A tenth of the time warms up (page faults, frequency).
                if measured_from.is_none() && elapsed >= time / 10 {
                    measured_from = Some((elapsed, acked));
                }
                if elapsed >= time + time / 10 {
                    break;
                }
            }
        }
        wait("the reader drains", || ring.word(ACK).load(Ordering::Acquire) == sent)?;
        let (t0, m0) = measured_from.ok_or("copy ring: no measurement window")?;
        let done = ring.word(ACK).load(Ordering::Acquire);
        let secs = (start.elapsed() - t0).as_secs_f64();
        Ok(((done - m0) as f64 * size as f64) / secs)
    })();
    ring.word(STOP).store(1, Ordering::Release);
    let status = child.wait(Duration::from_secs(10));
    let _ = std::fs::remove_file(&path);
    let bw = result?;
    status?;
    Ok(bw)
}

/// [`copy_ring`] from a thread of its own, pinned to core 0 with the
/// reader on core 1 where there are two cores (the caller's affinity stays
/// as it was).
pub fn copy_ring_pinned(exe: &Path, size: usize, slots: usize, time: Duration) -> Result<f64, String> {
    on_core_zero(|pinned| copy_ring(exe, size, slots, time, pinned))
}

/// Runs `measure(pinned)` on a thread of its own, pinned to core 0 where
/// this host has two cores or more (`pinned`: so the peer process it
/// starts takes core 1); the caller's affinity stays as it was.
pub fn on_core_zero<T: Send>(measure: impl FnOnce(bool) -> Result<T, String> + Send) -> Result<T, String> {
    let pinned = core_affinity::get_core_ids().unwrap_or_default().len() >= 2;
    std::thread::scope(|s| {
        s.spawn(|| {
            if pinned {
                core_affinity::set_for_current(core_affinity::CoreId { id: 0 });
            }
            measure(pinned)
        })
        .join()
        .map_err(|_| "measuring thread panicked".to_string())?
    })
}

/// The copy ring's reader (`ordo fabric-peer --role copyring --path P`).
pub fn copy_ring_peer(path: &Path) -> Result<(), String> {
    let ring = open(path, None)?;
    let size = ring.word(SIZE).load(Ordering::Acquire) as usize;
    let slots = ring.word(SLOTS).load(Ordering::Acquire) as usize;
    if size < 8 || !size.is_multiple_of(8) || slots == 0 || ring.map.len() < RING + slots * size {
        return Err(format!("copy ring: bad geometry {size} B x {slots}"));
    }
    let mut consumed = 0u64;
    let mut checksum = 0u64;
    loop {
        let mut seq = ring.word(SEQ).load(Ordering::Acquire);
        if seq == consumed {
            wait("the writer publishes", || {
                seq = ring.word(SEQ).load(Ordering::Acquire);
                seq > consumed || ring.word(STOP).load(Ordering::Acquire) == 1
            })?;
            if seq == consumed {
                break;
            }
        }
        for m in consumed + 1..=seq {
            let slot = ring.slot(m as usize % slots, size) as *const u64;
            // SAFETY: the slot holds size/8 aligned words; the writer does
            // not touch it until we acknowledge.
            let first = unsafe { slot.read_volatile() };
            if first != m {
                return Err(format!("copy ring: message {m} not visible under its counter (read {first})"));
            }
            // SAFETY: as above.
            checksum ^= unsafe { read_every_byte(slot as *const u8, size) };
        }
        consumed = seq;
        ring.word(ACK).store(consumed, Ordering::Release);
    }
    ring.word(CHECKSUM).store(checksum, Ordering::Relaxed);
    Ok(())
}

/// Reads every 8-byte word of `len` bytes at `ptr` (volatile loads the
/// compiler cannot skip) and returns their XOR: how both the copy ring's
/// reader and the fabric benchmark's reading peer consume a message, so
/// they compare like with like.
///
/// # Safety
/// `ptr` is 8-aligned and `len` bytes from it are mapped and readable.
pub unsafe fn read_every_byte(ptr: *const u8, len: usize) -> u64 {
    let words = ptr as *const u64;
    let mut sum = 0u64;
    for k in 0..len / 8 {
        // SAFETY: in bounds by the caller's promise.
        sum ^= unsafe { words.add(k).read_volatile() };
    }
    sum
}

/// When [`udp_round_trip`] sends its pings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Spacing {
    /// Each as soon as the last one's echo is back.
    BackToBack,
    /// Poisson arrivals at this rate (per second), spinning in between: the
    /// spacing of a light load's requests.
    Poisson(f64),
}

/// Busy-polled UDP round trips on loopback with plain sockets: one thread
/// echoes, this one sends (as `spacing` says) and spins on `recv`. Returns
/// the round trip's (p50, p99, samples) in ns over `rounds`, after a tenth
/// as many as warm-up.
pub fn udp_round_trip(rounds: u64, size: usize, spacing: Spacing) -> Result<(f64, f64, u64), String> {
    if let Spacing::Poisson(rate) = spacing {
        assert!(rate > 0.0 && rate.is_finite(), "a Poisson spacing needs a positive rate");
    }
    use std::net::UdpSocket;
    let e = |e: std::io::Error| e.to_string();
    let server = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
    let client = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
    server.set_nonblocking(true).map_err(e)?;
    client.set_nonblocking(true).map_err(e)?;
    client.connect(server.local_addr().map_err(e)?).map_err(e)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Result<u64, String> {
            let mut buf = vec![0u8; 65536];
            let mut echoed = 0;
            while !stop.load(Ordering::Relaxed) {
                match server.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        server.send_to(&buf[..n], from).map_err(|e| e.to_string())?;
                        echoed += 1;
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(err) => return Err(err.to_string()),
                }
            }
            Ok(echoed)
        })
    };
    let result = (|| {
        let mut out = vec![0u8; size.max(8)];
        let mut buf = vec![0u8; 65536];
        let mut hist = Histogram::<u64>::new(3).expect("histogram");
        let warmup = rounds / 10;
        // The load generator's arrival process, so the pings are spaced
        // exactly as its requests are.
        let mut rng = crate::r3p2_bench::Rng::new(0x5EED);
        let mut due = Instant::now();
        for i in 0..rounds + warmup {
            out[..8].copy_from_slice(&i.to_le_bytes());
            if let Spacing::Poisson(rate) = spacing {
                due += Duration::from_nanos(rng.poisson_gap_ns(rate) as u64);
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
            }
            let start = Instant::now();
            client.send(&out).map_err(e)?;
            let deadline = start + Duration::from_secs(5);
            loop {
                match client.recv(&mut buf) {
                    Ok(n) if n == out.len() && buf[..8] == out[..8] => break,
                    Ok(_) => {} // a late echo of an earlier round
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return Err("udp echo did not answer within 5 s".to_string());
                        }
                        std::hint::spin_loop();
                    }
                    Err(err) => return Err(err.to_string()),
                }
            }
            if i >= warmup {
                hist.record(start.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
            }
        }
        Ok((hist.value_at_quantile(0.5) as f64, hist.value_at_quantile(0.99) as f64, hist.len()))
    })();
    stop.store(true, Ordering::Relaxed);
    echo.join().map_err(|_| "udp echo thread panicked".to_string())??;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_round_trip_measures_every_round() {
        let (p50, p99, n) = udp_round_trip(200, 64, Spacing::BackToBack).unwrap();
        assert_eq!(n, 200);
        assert!(p50 > 0.0 && p99 >= p50);
    }

    #[test]
    fn spaced_round_trips_keep_their_rate() {
        // 220 pings (200 + a tenth as warm-up) at 10,000/s: ~22 ms of gaps.
        let start = Instant::now();
        let (p50, p99, n) = udp_round_trip(200, 64, Spacing::Poisson(10_000.0)).unwrap();
        let took = start.elapsed();
        assert_eq!(n, 200);
        assert!(p50 > 0.0 && p99 >= p50);
        assert!(took >= Duration::from_millis(10), "the pings were spaced ({took:?} for 220 at 10k/s)");
    }

    #[test]
    fn the_copy_ring_reader_refuses_bad_geometry() {
        let path = std::env::temp_dir().join(format!("ordo-copyring-test-{}", std::process::id()));
        let ring = open(&path, Some(RING + 64)).unwrap();
        ring.word(SIZE).store(12, Ordering::Relaxed);
        ring.word(SLOTS).store(1, Ordering::Relaxed);
        assert!(copy_ring_peer(&path).unwrap_err().contains("bad geometry"));
        ring.word(SIZE).store(64, Ordering::Relaxed);
        ring.word(SLOTS).store(2, Ordering::Relaxed);
        assert!(copy_ring_peer(&path).unwrap_err().contains("bad geometry"), "2 slots of 64 B do not fit");
        std::fs::remove_file(&path).unwrap();
    }
}
