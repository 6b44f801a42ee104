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
use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which backend a peer uses.
#[derive(Clone, Debug)]
pub enum PeerBackend {
    /// shm: the cluster name (files in /dev/shm).
    Shm {
        /// Cluster name shared with the coordinator; it names the region files.
        cluster: String,
    },
    /// tcp: the peer listens on an ephemeral loopback port, prints
    /// `LISTEN <addr>` on stdout, and waits for member 0 (listening at
    /// `coordinator`) to dial it.
    Tcp {
        /// Cluster name shared with the coordinator (checked in the handshake).
        cluster: String,
        /// The address member 0 (the coordinator) listens on.
        coordinator: std::net::SocketAddr,
        /// TLS: the directory of [`crate::fabric::write_test_pki`]'s files.
        tls_dir: Option<PathBuf>,
    },
    /// ofi: as tcp, on libfabric `provider`; the addresses are the
    /// members' contact ports.
    Ofi {
        /// The libfabric provider.
        provider: String,
        /// Datagram or connected endpoints.
        endpoint: ordo_runtime::OfiEndpoint,
        /// Cluster name shared with the coordinator.
        cluster: String,
        /// Member 0's contact address.
        coordinator: std::net::SocketAddr,
    },
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
    /// The backend and how to reach the coordinator on it.
    pub backend: PeerBackend,
    /// What to do once connected.
    pub role: Role,
    /// Core to pin to, if any.
    pub core: Option<usize>,
    /// Spin (true) or spin-then-park (false) while waiting.
    pub spin: bool,
    /// Exit when idle this long.
    pub idle_exit: Duration,
}

/// What a tcp peer is given to authenticate its link (none for shm).
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerCredentials<'a> {
    /// The cluster secret, handed down in [`ordo_runtime::SECRET_ENV`].
    pub secret: Option<&'a ordo_runtime::Secret>,
    /// TLS: the directory of [`crate::fabric::write_test_pki`]'s files.
    pub tls_dir: Option<&'a std::path::Path>,
}

/// The cluster secret a parent handed down in [`ordo_runtime::SECRET_ENV`],
/// if it did.
pub fn secret_from_env() -> Result<Option<ordo_runtime::Secret>, String> {
    if std::env::var_os(ordo_runtime::SECRET_ENV).is_none() {
        return Ok(None);
    }
    let source = ordo_runtime::SecretSource::Env(ordo_runtime::SECRET_ENV.into());
    ordo_runtime::Secret::load(&source).map(Some).map_err(|e| e.to_string())
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
        PeerBackend::Tcp { cluster, coordinator, tls_dir } => {
            let tls = tls_dir.as_deref().map(|d| crate::fabric::test_pki_settings(d, 1)).transpose()?;
            let binding = crate::fabric::tcp_bind(1, cluster, secret_from_env()?, tls)?;
            announce(&format!("LISTEN {}", binding.local_addr()));
            let f = binding.connect(vec![(0, *coordinator)]).map_err(|e| e.to_string())?;
            announce("READY");
            serve(f, &opts)
        }
        #[cfg(feature = "ofi")]
        PeerBackend::Ofi { provider, endpoint, cluster, coordinator } => {
            let secret = secret_from_env()?.ok_or("the ofi peer needs the cluster secret")?;
            let binding = crate::fabric::ofi_bind(1, provider, *endpoint, cluster, secret)?;
            announce(&format!("LISTEN {}", binding.contact_addr()));
            let f = binding.connect(vec![(0, *coordinator)]).map_err(|e| e.to_string())?;
            announce("READY");
            serve(f, &opts)
        }
        #[cfg(not(feature = "ofi"))]
        PeerBackend::Ofi { .. } => Err("this ordo was built without the `ofi` feature".into()),
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
        if size > MAX_SIZE
            || size == 0
            || (matches!(op, Op::Sink | Op::SinkSampled | Op::SinkRead)
                && (slots == 0 || slots * size > STREAM_BYTES))
        {
            return Err(format!("bad command: size {size} slots {slots}"));
        }
        match op {
            Op::Exit => {
                f.region().store_release(DONE, last_cmd);
                // The coordinator may be gone already; exiting is what matters.
                let _ = post(&mut f, 0, DONE, 8);
                std::thread::sleep(Duration::from_millis(20));
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
            Op::Sink | Op::SinkSampled | Op::SinkRead => {
                let target = stream + count;
                while stream < target {
                    waiter.until(&mut f, |f| f.region().load_acquire(STREAM_SEQ) > stream)?;
                    let seen = f.region().load_acquire(STREAM_SEQ);
                    let first_checked = if op == Op::SinkSampled { seen } else { stream + 1 };
                    for j in first_checked..=seen {
                        let slot = STREAM + ((j as usize) % slots) * size;
                        let (first, last) =
                            (f.region().load_acquire(slot), f.region().load_acquire(slot + size - 8));
                        if first != j || last != !j {
                            return Err(format!(
                                "stream message {j} not visible under guard {seen}: words {first} {:#x}",
                                last
                            ));
                        }
                        if op == Op::SinkRead {
                            assert!(slot + size <= f.region().len() && slot.is_multiple_of(8));
                            // SAFETY: the slot lies in the region (checked)
                            // and is 8-aligned; the coordinator does not
                            // rewrite it before our ack.
                            let sum = unsafe {
                                crate::limits::read_every_byte(f.region().as_ptr().add(slot), size)
                            };
                            std::hint::black_box(sum);
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

/// A spawned peer process; killed if dropped before it exits.
pub struct PeerChild {
    /// The spawned peer process.
    pub child: Child,
    /// The tcp peer's listen address, once it reported it.
    pub listen: Option<std::net::SocketAddr>,
}

impl PeerChild {
    /// Waits for the peer to exit; `Err` unless it exits successfully.
    pub fn wait(mut self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return if status.success() { Ok(()) } else { Err(format!("exited with {status}")) };
            }
            if start.elapsed() > limit {
                return Err("did not exit".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl PeerChild {
    /// Kills the peer with SIGKILL (as a crash) and reaps it.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PeerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Spawns `exe fabric-peer ...` as member 1 of a two-member group.
pub fn spawn_peer(
    exe: &PathBuf,
    backend: crate::fabric::Backend,
    cluster: &str,
    spin: bool,
    pinned: bool,
    coordinator: Option<std::net::SocketAddr>,
    credentials: PeerCredentials<'_>,
) -> Result<PeerChild, String> {
    let PeerCredentials { secret, tls_dir } = credentials;
    let mut cmd = Command::new(exe);
    let tcp = backend != crate::fabric::Backend::Shm;
    let name = match backend {
        crate::fabric::Backend::Shm => "shm",
        b if b.ofi_provider().is_some() => b.name(),
        _ => "tcp",
    };
    cmd.args(["fabric-peer", "--backend", name, "--cluster", cluster, "--role", "serve"]);
    if let Some(secret) = secret {
        cmd.env(ordo_runtime::SECRET_ENV, secret.env_value().ok_or("a generated secret is text")?);
    }
    if let Some(dir) = tls_dir {
        cmd.arg("--tls-dir").arg(dir);
    }
    if let Some(addr) = coordinator {
        cmd.args(["--tcp-peer", &addr.to_string()]);
    }
    if spin {
        cmd.arg("--spin");
    }
    if pinned {
        cmd.args(["--core", "1"]);
    }
    cmd.stdout(if tcp { Stdio::piped() } else { Stdio::null() }).stderr(Stdio::inherit());
    let child = cmd.spawn().map_err(|e| format!("spawning {}: {e}", exe.display()))?;
    let mut peer = PeerChild { child, listen: None };
    if let Some(stdout) = peer.child.stdout.take() {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
        peer.listen = line.strip_prefix("LISTEN ").and_then(|s| s.trim().parse().ok());
    }
    Ok(peer)
}
