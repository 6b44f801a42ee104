//! One Acuerdo member as an OS process (`ordo acuerdo-peer ...`), for the
//! kill -9 tests: it joins a group on the shm or tcp fabric, broadcasts a
//! paced closed-loop load whenever it leads, and records what it delivered.
//!
//! # Files
//! - `<out>`: one line per delivered message, appended in commit order:
//!   `round leader count digest` (the header, and an FNV-1a 64 digest of the
//!   payload in hex). Flushed every 20 ms, so a killed member leaves a
//!   prefix of its sequence (complete lines only count).
//! - `<out>.status`: one JSON object ([`PeerStatus`]), replaced atomically
//!   (write + rename) every 20 ms and at exit.
//!
//! # tcp start-up
//! A tcp member binds an ephemeral loopback port, prints `LISTEN <addr>` on
//! stdout and reads `PEERS <id>=<addr>,...` (every member) from stdin.
//!
//! # Invariants
//! - Bounded: the process exits after `--max-seconds` at the latest, or
//!   when `--stop-file` appears (then it flushes and exits 0).
//! - The load never exceeds `--window` messages in flight nor `--rate`
//!   messages per second.

use clap::Parser;
use ordo_acuerdo::Header;
use ordo_fabric::MemberId;
use ordo_runtime::MemberFabric;
use ordo_runtime::acuerdo::{
    ClientEvent, MemberOptions, region_len, runtime_config, start_member, tcp_options,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Arguments of `ordo acuerdo-peer`.
#[derive(Parser, Debug, Clone)]
#[command(name = "ordo acuerdo-peer", about = "One Acuerdo member process (tests)")]
pub struct PeerArgs {
    /// Fabric backend: shm, tcp, or ofi (libfabric tcp;ofi_rxm), ofi-shm,
    /// ofi-tcp-msg (connected endpoints) in a build with the `ofi` feature.
    #[arg(long, default_value = "shm")]
    pub backend: String,
    /// Cluster name (shm file names, tcp handshake).
    #[arg(long)]
    pub cluster: String,
    /// This member.
    #[arg(long)]
    pub id: MemberId,
    /// Every member.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub members: Vec<MemberId>,
    /// Delivered-sequence file (status in `<out>.status`).
    #[arg(long)]
    pub out: PathBuf,
    /// Messages in flight while leading.
    #[arg(long, default_value_t = 4)]
    pub window: u64,
    /// Most messages per second while leading (0: unlimited).
    #[arg(long, default_value_t = 5000)]
    pub rate: u64,
    /// Payload bytes (≥ 16).
    #[arg(long, default_value_t = 32)]
    pub size: usize,
    /// Exit (cleanly) once this file exists.
    #[arg(long)]
    pub stop_file: Option<PathBuf>,
    /// Exit after this many seconds at the latest.
    #[arg(long, default_value_t = 30)]
    pub max_seconds: u64,
    /// This member's incarnation (1 at the group's start).
    #[arg(long, default_value_t = 1)]
    pub incarnation: u64,
    /// Heartbeat timeout in milliseconds.
    #[arg(long, default_value_t = 30)]
    pub heartbeat_timeout_ms: u64,
}

/// What `<out>.status` says.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PeerStatus {
    /// The member.
    pub member: MemberId,
    /// "Leader", "Follower" or "Electing".
    pub role: String,
    /// The leader it follows (or itself).
    pub leader: Option<MemberId>,
    /// Its epoch as (round, leader).
    pub epoch: (u32, MemberId),
    /// Messages delivered.
    pub delivered: u64,
    /// Elections won.
    pub elections_won: u64,
    /// Own messages committed.
    pub committed_own: u64,
    /// Own messages lost in leader changes.
    pub lost_own: u64,
    /// Whether it exited cleanly.
    pub exited: bool,
}

/// FNV-1a 64 of `bytes`.
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// One delivered message as recorded in the `<out>` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeliveredLine {
    /// Its header.
    pub header: Header,
    /// Digest of its payload.
    pub digest: u64,
}

/// Parses the complete lines of an `<out>` file.
pub fn read_delivered(path: &Path) -> Result<Vec<DeliveredLine>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let bad = || format!("bad line {l:?} in {}", path.display());
            if f.len() != 4 {
                return Err(bad());
            }
            let round: u32 = f[0].parse().map_err(|_| bad())?;
            let leader: MemberId = f[1].parse().map_err(|_| bad())?;
            let count: u32 = f[2].parse().map_err(|_| bad())?;
            let digest = u64::from_str_radix(f[3], 16).map_err(|_| bad())?;
            Ok(DeliveredLine { header: ordo_acuerdo::Epoch::new(round, leader).header(count), digest })
        })
        .collect()
}

/// Reads `<out>.status` (None until the member wrote one).
pub fn read_status(out: &Path) -> Option<PeerStatus> {
    let text = std::fs::read_to_string(status_path(out)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The status file of `out`.
pub fn status_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".status");
    PathBuf::from(s)
}

fn write_status(out: &Path, status: &PeerStatus) -> Result<(), String> {
    let path = status_path(out);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, serde_json::to_string(status).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Entry point of `ordo acuerdo-peer` (`args` without the program name).
pub fn main(args: &[String]) -> Result<(), String> {
    let argv = std::iter::once("ordo acuerdo-peer".to_string()).chain(args.iter().cloned());
    match PeerArgs::try_parse_from(argv) {
        Ok(a) => run(&a),
        Err(e) if !e.use_stderr() => {
            let _ = write!(std::io::stdout(), "{e}");
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

fn connect(args: &PeerArgs, region: usize) -> Result<MemberFabric, String> {
    match args.backend.as_str() {
        "shm" => {
            let o =
                ordo_fabric_shm::ShmOptions::new(args.cluster.clone(), args.id, args.members.clone(), region);
            Ok(MemberFabric::Shm(ordo_fabric_shm::ShmFabric::create(o).map_err(|e| e.to_string())?))
        }
        "tcp" => {
            let mut o = tcp_options(args.id, &args.cluster, region, "127.0.0.1:0".parse().expect("address"));
            // Authentication is on: the parent hands the members a secret.
            o.secret = Some(crate::peer::secret_from_env()?.ok_or_else(|| {
                format!("the tcp backend needs the cluster secret in {}", ordo_runtime::SECRET_ENV)
            })?);
            let binding = ordo_fabric_tcp::TcpFabric::bind(o).map_err(|e| e.to_string())?;
            let peers = exchange_addresses(args, binding.local_addr())?;
            Ok(MemberFabric::Tcp(binding.connect(peers).map_err(|e| e.to_string())?))
        }
        #[cfg(feature = "ofi")]
        "ofi" | "ofi-rxm" | "ofi-shm" | "ofi-tcp-msg" => {
            // libfabric: `ofi` as the configuration's default (connected
            // tcp endpoints), or tcp;ofi_rxm, shm; the addresses exchanged
            // are the members' contact (set-up) ports.
            let secret = crate::peer::secret_from_env()?.ok_or_else(|| {
                format!("the ofi backend needs the cluster secret in {}", ordo_runtime::SECRET_ENV)
            })?;
            let provider = match args.backend.as_str() {
                "ofi-shm" => "shm",
                "ofi-rxm" => "tcp;ofi_rxm",
                _ => "tcp",
            };
            let mut o = ordo_fabric_ofi::OfiOptions::new(
                args.id,
                provider,
                "127.0.0.1:0".parse().expect("address"),
                region,
            );
            if matches!(args.backend.as_str(), "ofi" | "ofi-tcp-msg") {
                o.endpoint = ordo_fabric_ofi::EndpointType::Msg;
            }
            o.cluster = args.cluster.clone();
            o.secret = Some(secret);
            let binding = ordo_fabric_ofi::OfiFabric::bind(o).map_err(|e| e.to_string())?;
            let peers = exchange_addresses(args, binding.contact_addr())?;
            Ok(MemberFabric::Ofi(Box::new(binding.connect(peers).map_err(|e| e.to_string())?)))
        }
        other => Err(format!(
            "unknown backend {other:?} (shm, tcp, or ofi, ofi-shm, ofi-tcp-msg in a build with the ofi feature)"
        )),
    }
}

/// Prints `LISTEN <addr>`, reads `PEERS <id>=<addr>,...` and returns the
/// other members' addresses.
fn exchange_addresses(
    args: &PeerArgs,
    mine: std::net::SocketAddr,
) -> Result<Vec<(MemberId, std::net::SocketAddr)>, String> {
    let mut out = std::io::stdout();
    writeln!(out, "LISTEN {mine}").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| e.to_string())?;
    let list = line.trim().strip_prefix("PEERS ").ok_or_else(|| format!("expected PEERS, got {line:?}"))?;
    let mut peers = Vec::new();
    for item in list.split(',') {
        let (id, addr) = item.split_once('=').ok_or_else(|| format!("bad peer {item:?}"))?;
        let id: MemberId = id.parse().map_err(|_| format!("bad peer id {id:?}"))?;
        if id != args.id {
            peers.push((id, addr.parse().map_err(|_| format!("bad address {addr:?}"))?));
        }
    }
    Ok(peers)
}

/// Runs one member to the end (stop file or `max_seconds`).
pub fn run(args: &PeerArgs) -> Result<(), String> {
    if args.size < 16 {
        return Err("--size must be at least 16".into());
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.max_seconds);
    let mut cfg = runtime_config(args.members.clone(), args.id);
    cfg.incarnation = args.incarnation;
    cfg.max_payload = args.size.max(cfg.max_payload);
    cfg.heartbeat_timeout_ns = args.heartbeat_timeout_ms * 1_000_000;
    cfg.election_timeout_ns = cfg.heartbeat_timeout_ns + cfg.heartbeat_timeout_ns / 3;
    cfg.validate().map_err(|e| e.to_string())?;
    let fabric = connect(args, region_len(&cfg))?;
    let delivered: Arc<Mutex<Vec<(Header, u64)>>> = Arc::default();
    let d2 = delivered.clone();
    let options = MemberOptions {
        on_deliver: Some(Box::new(move |h, p| {
            d2.lock().unwrap_or_else(|p| p.into_inner()).push((h, digest(p)))
        })),
        ..MemberOptions::default()
    };
    let (runner, mut client) = start_member(fabric, cfg, options)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .map_err(|e| format!("{}: {e}", args.out.display()))?;
    let mut status = PeerStatus { member: args.id, ..PeerStatus::default() };
    let (mut seq, mut in_flight) = (0u64, 0u64);
    let mut lead_since: Option<(Instant, u64)> = None;
    let mut next_flush = Instant::now();
    let mut payload = vec![0u8; args.size];
    let live = client.status().clone();
    let flush = |file: &mut std::fs::File, status: &mut PeerStatus, exited: bool| -> Result<(), String> {
        let batch = std::mem::take(&mut *delivered.lock().unwrap_or_else(|p| p.into_inner()));
        let mut text = String::with_capacity(batch.len() * 40);
        for (h, d) in batch {
            text += &format!("{} {} {} {d:016x}\n", h.epoch.round, h.epoch.leader, h.count);
        }
        file.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        let e = live.epoch();
        status.role = format!("{:?}", live.role());
        status.leader = live.leader();
        status.epoch = (e.round, e.leader);
        status.delivered = live.delivered();
        status.elections_won = live.elections_won();
        status.exited = exited;
        write_status(&args.out, status)
    };
    loop {
        let now = Instant::now();
        if now >= deadline || args.stop_file.as_ref().is_some_and(|p| p.exists()) || runner.is_finished() {
            break;
        }
        let mut busy = false;
        while let Some(ev) = client.poll() {
            busy = true;
            match ev {
                ClientEvent::Accepted { .. }
                | ClientEvent::ReadReady { .. }
                | ClientEvent::ReadFailed { .. } => {}
                ClientEvent::Committed { .. } => {
                    in_flight -= 1;
                    status.committed_own += 1;
                }
                ClientEvent::Rejected { .. } => in_flight -= 1,
                ClientEvent::Lost { .. } | ClientEvent::Unknown { .. } => {
                    in_flight -= 1;
                    status.lost_own += 1;
                }
            }
        }
        if client.status().is_leader() {
            let (since, base) = *lead_since.get_or_insert((now, seq));
            let allowed = if args.rate == 0 {
                u64::MAX
            } else {
                base + 1 + ((now - since).as_micros() as u64 * args.rate) / 1_000_000
            };
            while in_flight < args.window && seq < allowed {
                payload[..4].copy_from_slice(&args.id.to_le_bytes());
                payload[4..12].copy_from_slice(&seq.to_le_bytes());
                if client.submit(&payload).is_err() {
                    break;
                }
                seq += 1;
                in_flight += 1;
                busy = true;
            }
        } else {
            lead_since = None;
        }
        if now >= next_flush {
            next_flush = now + Duration::from_millis(20);
            flush(&mut file, &mut status, false)?;
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let finished_early = runner.is_finished();
    let joined = runner.try_join().map_err(|p| p.to_string())?;
    drop(joined);
    flush(&mut file, &mut status, true)?;
    if finished_early {
        return Err("the member's agent stopped".into());
    }
    Ok(())
}
