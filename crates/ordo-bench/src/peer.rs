//! The remote member of a benchmark or multi-process test: a separate
//! process (`ordo fabric-peer ...`) that joins a two-member group as member 1
//! and serves the coordinator's commands ([`crate::protocol`]), or plays a
//! fixed role for a test.
//!
//! # Invariants
//! - A peer exits by itself when no command arrives for `idle_exit`, so a
//!   coordinator that crashed leaves nothing behind.
//! - A peer reports a protocol violation (wrong payload under a guard) as an
//!   error exit, never by continuing.

use crate::protocol::*;
use ordo_fabric::Fabric;
use ordo_fabric_shm::{ShmFabric, ShmOptions};
use std::io::Write as _;
use std::time::Duration;

/// Which backend a peer uses.
#[derive(Clone, Debug)]
pub enum PeerBackend {
    /// shm: the cluster name (files in /dev/shm).
    Shm { cluster: String },
    /// tcp: the peer listens on an ephemeral loopback port, prints
    /// `LISTEN <addr>` on stdout, and waits for member 0 (listening at
    /// `coordinator`) to dial it.
    Tcp { cluster: String, coordinator: std::net::SocketAddr },
}

/// What the peer does once connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serve benchmark commands until told to exit.
    Serve,
    /// Do nothing until killed (for SIGKILL tests); exits after `idle_exit`.
    Idle,
}

/// Options of a peer process.
#[derive(Clone, Debug)]
pub struct PeerOptions {
    pub backend: PeerBackend,
    pub role: Role,
    /// Core to pin to, if any.
    pub core: Option<usize>,
    /// Spin (true) or spin-then-park (false) while waiting.
    pub spin: bool,
    /// Exit when idle this long.
    pub idle_exit: Duration,
}

/// Runs a peer process to completion.
pub fn run(opts: PeerOptions) -> Result<(), String> {
    if let Some(core) = opts.core {
        core_affinity::set_for_current(core_affinity::CoreId { id: core });
    }
    match &opts.backend {
        PeerBackend::Shm { cluster } => {
            let f = ShmFabric::create(ShmOptions::new(cluster.clone(), 1, vec![0, 1], REGION_LEN))
                .map_err(|e| e.to_string())?;
            announce("READY");
            serve(f, &opts)
        }
        PeerBackend::Tcp { cluster, coordinator } => {
            let binding = crate::fabric::tcp_bind(1, cluster)?;
            announce(&format!("LISTEN {}", binding.local_addr()));
            let f = binding.connect(vec![(0, *coordinator)]).map_err(|e| e.to_string())?;
            announce("READY");
            serve(f, &opts)
        }
    }
}

fn serve<F: Fabric>(mut f: F, opts: &PeerOptions) -> Result<(), String> {
    let waiter = Waiter {
        park: if opts.spin { None } else { f.doorbell().cloned() },
        spins_before_park: 2000,
        deadline: opts.idle_exit,
    };
    if opts.role == Role::Idle {
        let deadline = std::time::Instant::now() + opts.idle_exit;
        while std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        return Ok(());
    }
    let mut last_cmd = 0u64;
    let (mut ping, mut stream) = (0u64, 0u64);
    loop {
        waiter.until(&mut f, |f| f.region().load_acquire(CMD_SEQ) > last_cmd)?;
        last_cmd = f.region().load_acquire(CMD_SEQ);
        let r = f.region();
        let op = Op::from_u64(r.load_acquire(CMD_OP)).ok_or("unknown op")?;
        let size = r.load_acquire(CMD_SIZE) as usize;
        let count = r.load_acquire(CMD_COUNT);
        let slots = r.load_acquire(CMD_SLOTS) as usize;
        if size > MAX_SIZE || size == 0 || (op == Op::Sink && (slots == 0 || slots * size > STREAM_BYTES)) {
            return Err(format!("bad command: size {size} slots {slots}"));
        }
        match op {
            Op::Exit => {
                f.region().store_release(DONE, last_cmd);
                post(&mut f, 0, DONE, 8)?;
                return Ok(());
            }
            Op::PingPong => {
                for _ in 0..count {
                    ping += 1;
                    waiter.until(&mut f, |f| f.region().load_acquire(PING) >= ping)?;
                    if size > 8 {
                        let got = f.region().load_acquire(PING_DATA);
                        if got != ping {
                            return Err(format!("ping {ping}: payload says {got}"));
                        }
                        f.region().store_release(PONG_DATA, ping);
                        post(&mut f, 0, PONG_DATA, size)?;
                    }
                    f.region().store_release(PONG, ping);
                    post(&mut f, 0, PONG, 8)?;
                }
            }
            Op::Sink => {
                let target = stream + count;
                while stream < target {
                    waiter.until(&mut f, |f| f.region().load_acquire(STREAM_SEQ) > stream)?;
                    let seen = f.region().load_acquire(STREAM_SEQ);
                    for j in stream + 1..=seen {
                        let slot = STREAM + ((j as usize) % slots) * size;
                        let got = f.region().load_acquire(slot);
                        if got != j {
                            return Err(format!("stream message {j}: slot holds {got}"));
                        }
                    }
                    stream = seen;
                    f.region().store_release(ACK, stream);
                    post(&mut f, 0, ACK, 8)?;
                }
            }
        }
        f.region().store_release(DONE, last_cmd);
        post(&mut f, 0, DONE, 8)?;
    }
}

/// Pins the calling thread to `core` (best effort).
pub fn pin(core: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// Tells the parent something on stdout (ignored if it does not listen).
fn announce(line: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
