//! Wiring: from an [`OrdoConfig`] to a connected fabric endpoint, and the
//! member heartbeat agent that `ordo member` runs.
//!
//! # Invariants
//! - [`connect_fabric`] validates the configuration first; a bad one is a
//!   [`WiringError::Config`] naming the key, and nothing is created.
//! - [`MemberFabric`] dispatches statically (an enum, not `dyn`), so the data
//!   path stays monomorphic.

#[cfg(feature = "ofi")]
use crate::config::OfiEndpoint;
use crate::config::{Backend, OrdoConfig};
use crate::{Agent, ValidationError};
use ordo_fabric::{
    Doorbell, Fabric, FabricEvent, MemberId, PartialPost, PostError, ReconnectError, Region, Write, WriteTag,
};
use ordo_fabric_shm::{ShmFabric, ShmOptions};
use ordo_fabric_tcp::{TcpFabric, TcpOptions};
use ordo_sst::{CounterCol, LayoutBuilder, Sst};
use std::net::{SocketAddr, ToSocketAddrs};

/// A member's fabric endpoint, whichever backend the config chose.
pub enum MemberFabric {
    /// `fabric.backend = "shm"`.
    Shm(ShmFabric),
    /// `fabric.backend = "tcp"`.
    Tcp(TcpFabric),
    /// `fabric.backend = "ofi"` (with the `ofi` feature).
    #[cfg(feature = "ofi")]
    Ofi(Box<ordo_fabric_ofi::OfiFabric>),
}

macro_rules! dispatch {
    ($self:expr, $f:ident => $e:expr) => {
        match $self {
            MemberFabric::Shm($f) => $e,
            MemberFabric::Tcp($f) => $e,
            #[cfg(feature = "ofi")]
            MemberFabric::Ofi($f) => $e,
        }
    };
}

impl Fabric for MemberFabric {
    fn member(&self) -> MemberId {
        dispatch!(self, f => f.member())
    }
    fn peers(&self) -> &[MemberId] {
        dispatch!(self, f => f.peers())
    }
    fn region(&self) -> &Region {
        dispatch!(self, f => f.region())
    }
    #[inline]
    fn post_write(&mut self, write: Write) -> Result<(), PostError> {
        dispatch!(self, f => f.post_write(write))
    }
    #[inline]
    fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
        dispatch!(self, f => f.post_writes(peer, ranges))
    }
    fn address_ordered(&self) -> bool {
        dispatch!(self, f => f.address_ordered())
    }
    fn peer_region(&self, peer: MemberId) -> Option<Region> {
        dispatch!(self, f => f.peer_region(peer))
    }
    fn poll_events(&mut self, events: &mut Vec<FabricEvent>) {
        dispatch!(self, f => f.poll_events(events))
    }
    fn doorbell(&self) -> Option<&Doorbell> {
        dispatch!(self, f => f.doorbell())
    }
    fn is_suspected(&self, peer: MemberId) -> bool {
        dispatch!(self, f => f.is_suspected(peer))
    }
    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        dispatch!(self, f => f.reconnect(peer))
    }
}

/// Why a fabric could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ValidationError),
    /// An address in the configuration does not resolve.
    #[error("fabric.tcp: cannot resolve {addr:?}: {why}")]
    Address {
        /// The address as written in the configuration.
        addr: String,
        /// Why resolving it failed (or "no address" if it resolved to none).
        why: String,
    },
    /// The shm backend failed to start.
    #[error(transparent)]
    Shm(#[from] ordo_fabric_shm::ShmError),
    /// The tcp backend failed to start.
    #[error(transparent)]
    Tcp(#[from] ordo_fabric_tcp::TcpError),
    /// The ofi backend failed to start.
    #[cfg(feature = "ofi")]
    #[error(transparent)]
    Ofi(#[from] ordo_fabric_ofi::OfiFabricError),
    /// The cluster secret could not be read (the message names its source,
    /// never its bytes).
    #[error(transparent)]
    Secret(#[from] ordo_auth::SecretError),
}

fn resolve(addr: &str) -> Result<SocketAddr, WiringError> {
    addr.to_socket_addrs()
        .map_err(|e| WiringError::Address { addr: addr.into(), why: e.to_string() })?
        .next()
        .ok_or_else(|| WiringError::Address { addr: addr.into(), why: "no address".into() })
}

/// Creates this member's endpoint as the config says, waiting for peers.
pub fn connect_fabric(config: &OrdoConfig) -> Result<MemberFabric, WiringError> {
    connect_fabric_with(config, None)
}

/// Creates the endpoint of a new view: as [`connect_fabric`], but a peer
/// that does not come up within `wait` is suspected rather than failing the
/// whole endpoint (it may have died after the view was decided; the next
/// view change removes it).
pub fn connect_view_fabric(
    config: &OrdoConfig,
    wait: std::time::Duration,
) -> Result<MemberFabric, WiringError> {
    connect_fabric_with(config, Some(wait))
}

fn connect_fabric_with(
    config: &OrdoConfig,
    missing_after: Option<std::time::Duration>,
) -> Result<MemberFabric, WiringError> {
    config.validate()?;
    let me = config.member.id;
    let f = &config.fabric;
    match f.backend {
        Backend::Shm => {
            let mut o =
                ShmOptions::new(f.shm.cluster.clone(), me, config.group.members.clone(), f.region_bytes);
            o.dir = f.shm.dir.clone();
            o.open_timeout = f.shm.open_timeout();
            o.liveness_check_interval = f.shm.liveness_check_interval();
            if let Some(wait) = missing_after {
                o.open_timeout = wait;
                o.suspect_missing_peers = true;
            }
            Ok(MemberFabric::Shm(ShmFabric::create(o)?))
        }
        Backend::Tcp => {
            let listen = resolve(f.tcp.listen_addr(me).unwrap_or_default())?;
            let mut o = TcpOptions::new(me, listen, f.region_bytes);
            o.max_frame_bytes = f.tcp.max_frame_bytes;
            o.send_buffer_bytes = f.tcp.send_buffer_bytes;
            o.write_timeout = f.write_timeout();
            o.connect_timeout = f.tcp.connect_timeout();
            o.reconnect_interval = f.tcp.reconnect_interval();
            o.handshake_timeout = f.tcp.handshake_timeout();
            o.max_handshakes_per_source = f.tcp.max_handshakes_per_source;
            o.cluster = f.shm.cluster.clone();
            o.secret = config.security.load_secret()?;
            if let Some(wait) = missing_after {
                o.connect_timeout = wait;
                o.suspect_missing_peers = true;
                // Peers open the new view within milliseconds of each other;
                // the first dial often meets the old view's listener.
                o.reconnect_interval = o.reconnect_interval.min(std::time::Duration::from_millis(2));
            }
            if let Some(t) = &f.tcp.tls {
                o.tls = Some(ordo_fabric_tcp::TlsSettings::from_pem_files(&t.cert, &t.key, &t.ca)?);
            }
            let mut peers = Vec::new();
            for &p in config.group.members.iter().filter(|p| **p != me) {
                peers.push((p, resolve(f.tcp.peer_addr(p).unwrap_or_default())?));
            }
            Ok(MemberFabric::Tcp(TcpFabric::connect(o.with_peers(peers))?))
        }
        #[cfg(feature = "ofi")]
        Backend::Ofi => {
            let listen = resolve(f.tcp.listen_addr(me).unwrap_or_default())?;
            let mut o = ordo_fabric_ofi::OfiOptions::new(me, &f.ofi.provider, listen, f.region_bytes);
            o.endpoint = ofi_endpoint(f.ofi.endpoint);
            o.write_timeout = f.write_timeout();
            o.connect_timeout = f.tcp.connect_timeout();
            o.handshake_timeout = f.tcp.handshake_timeout();
            o.cluster = f.shm.cluster.clone();
            o.secret = config.security.load_secret()?;
            if let Some(wait) = missing_after {
                o.connect_timeout = wait;
                o.suspect_missing_peers = true;
            }
            for &p in config.group.members.iter().filter(|p| **p != me) {
                o.peers.push((p, resolve(f.tcp.peer_addr(p).unwrap_or_default())?));
            }
            Ok(MemberFabric::Ofi(Box::new(ordo_fabric_ofi::OfiFabric::connect(o)?)))
        }
        #[cfg(not(feature = "ofi"))]
        Backend::Ofi => Err(WiringError::Config(ValidationError::Ofi {
            reason: "this build has no libfabric backend (build with `--features ofi`)".into(),
        })),
    }
}

/// Connects every member of a group inside this process (one thread per
/// member while connecting, since each endpoint waits for the others):
/// shm files in `/dev/shm` named by `cluster`, or tcp (or libfabric's
/// `tcp`, connected endpoints) on loopback ephemeral ports, authenticated with a secret
/// generated for this group. Returns the
/// endpoints in the order of `members`.
pub fn connect_local_group(
    backend: Backend,
    cluster: &str,
    members: &[MemberId],
    region_len: usize,
) -> Result<Vec<MemberFabric>, WiringError> {
    let results: Vec<Result<MemberFabric, WiringError>> = match backend {
        Backend::Shm => std::thread::scope(|s| {
            let handles: Vec<_> = members
                .iter()
                .map(|&m| {
                    let o = ordo_fabric_shm::ShmOptions::new(cluster, m, members.to_vec(), region_len);
                    s.spawn(move || ordo_fabric_shm::ShmFabric::create(o).map(MemberFabric::Shm))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("connect thread").map_err(WiringError::from))
                .collect()
        }),
        Backend::Tcp => {
            let secret = ordo_auth::Secret::generate();
            let mut bindings = Vec::new();
            for &m in members {
                let mut o = tcp_options(m, cluster, region_len, "127.0.0.1:0".parse().expect("address"));
                o.secret = Some(secret.clone());
                bindings.push(ordo_fabric_tcp::TcpFabric::bind(o)?);
            }
            let addrs: Vec<(MemberId, std::net::SocketAddr)> =
                members.iter().copied().zip(bindings.iter().map(|b| b.local_addr())).collect();
            std::thread::scope(|s| {
                let handles: Vec<_> = bindings
                    .into_iter()
                    .zip(members)
                    .map(|(b, &m)| {
                        let peers = addrs.iter().copied().filter(|p| p.0 != m).collect();
                        s.spawn(move || b.connect(peers).map(MemberFabric::Tcp))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("connect thread").map_err(WiringError::from))
                    .collect()
            })
        }
        #[cfg(feature = "ofi")]
        Backend::Ofi => {
            return connect_local_ofi_group("tcp", OfiEndpoint::Msg, cluster, members, region_len);
        }
        #[cfg(not(feature = "ofi"))]
        Backend::Ofi => {
            return Err(WiringError::Config(ValidationError::Ofi {
                reason: "this build has no libfabric backend (build with `--features ofi`)".into(),
            }));
        }
    };
    results.into_iter().collect()
}

/// The ofi backend's endpoint type for `fabric.ofi.endpoint`.
#[cfg(feature = "ofi")]
pub fn ofi_endpoint(e: OfiEndpoint) -> ordo_fabric_ofi::EndpointType {
    match e {
        OfiEndpoint::Rdm => ordo_fabric_ofi::EndpointType::Rdm,
        OfiEndpoint::Msg => ordo_fabric_ofi::EndpointType::Msg,
    }
}

/// [`connect_local_group`] on libfabric's `provider`: every member binds a
/// loopback contact port, then all connect (authenticated with a secret
/// generated for this group).
#[cfg(feature = "ofi")]
pub fn connect_local_ofi_group(
    provider: &str,
    endpoint: OfiEndpoint,
    cluster: &str,
    members: &[MemberId],
    region_len: usize,
) -> Result<Vec<MemberFabric>, WiringError> {
    let secret = ordo_auth::Secret::generate();
    let mut bindings = Vec::new();
    for &m in members {
        let mut o = ordo_fabric_ofi::OfiOptions::new(
            m,
            provider,
            "127.0.0.1:0".parse().expect("address"),
            region_len,
        );
        o.endpoint = ofi_endpoint(endpoint);
        o.cluster = cluster.to_string();
        o.secret = Some(secret.clone());
        bindings.push(ordo_fabric_ofi::OfiFabric::bind(o)?);
    }
    let addrs: Vec<(MemberId, SocketAddr)> =
        members.iter().copied().zip(bindings.iter().map(|b| b.contact_addr())).collect();
    let mut out = Vec::new();
    for (b, &m) in bindings.into_iter().zip(members) {
        let peers = addrs.iter().copied().filter(|p| p.0 != m).collect();
        out.push(MemberFabric::Ofi(Box::new(b.connect(peers)?)));
    }
    Ok(out)
}

/// Tcp options for a member of an in-process or benchmark group: frames as
/// large as the region (a ring plan can cover a whole ring), a send buffer
/// of a few of them, and quick redials. The secret is the caller's to set
/// ([`ordo_fabric_tcp::TcpOptions::secret`]; see [`SECRET_ENV`] for child
/// processes).
pub fn tcp_options(
    me: MemberId,
    cluster: &str,
    region_len: usize,
    listen: std::net::SocketAddr,
) -> ordo_fabric_tcp::TcpOptions {
    let mut o = ordo_fabric_tcp::TcpOptions::new(me, listen, region_len);
    o.cluster = cluster.to_string();
    o.max_frame_bytes = region_len;
    o.send_buffer_bytes = (4 * region_len).max(8 << 20);
    o.reconnect_interval = std::time::Duration::from_millis(20);
    o
}

/// The environment variable through which a parent process (a benchmark,
/// `ordo demo`, `ordo r3p2 cluster`) hands a generated cluster secret to
/// the members it starts; `security.secret_env` may name it too.
pub const SECRET_ENV: &str = "ORDO_CLUSTER_SECRET";

/// A member's liveness agent: every `interval_ns` it bumps its heartbeat
/// counter in the SST and pushes it to every peer as a signaled write, so a
/// dead or unreachable peer is suspected within a write timeout; it tries
/// to reconnect suspected peers at the same pace. It is the smallest real
/// user of fabric + SST + runtime, and what `ordo member` runs.
pub struct HeartbeatAgent<F: Fabric> {
    fabric: F,
    sst: Sst,
    heartbeat: CounterCol,
    interval_ns: u64,
    next_beat_ns: u64,
    beats: i64,
    peers: Vec<MemberId>,
    events: Vec<FabricEvent>,
    /// Fabric events other than completions, with the time seen (ns); the
    /// first [`HeartbeatAgent::LOG_LIMIT`] are kept, later ones counted.
    pub log: Vec<(u64, FabricEvent)>,
    /// Events beyond the log's limit.
    pub log_dropped: u64,
}

impl<F: Fabric> HeartbeatAgent<F> {
    /// Most events [`HeartbeatAgent::log`] keeps (bounded memory under a
    /// flapping peer).
    pub const LOG_LIMIT: usize = 10_000;

    /// An agent over `fabric` with an SST at region offset 0.
    pub fn new(fabric: F, members: &[MemberId], interval_ns: u64) -> Result<Self, ordo_sst::SstError> {
        let mut b = LayoutBuilder::new();
        let heartbeat = b.counter("heartbeat");
        let me = fabric.member();
        let sst = Sst::new(fabric.region().clone(), 0, b.build(), members, me)?;
        let peers = fabric.peers().to_vec();
        Ok(HeartbeatAgent {
            peers,
            log_dropped: 0,
            fabric,
            sst,
            heartbeat,
            interval_ns,
            next_beat_ns: 0,
            beats: -1,
            events: Vec::new(),
            log: Vec::new(),
        })
    }

    /// The latest heartbeat seen from each member (row order = sorted ids).
    pub fn heartbeats(&self) -> Vec<(MemberId, i64, bool)> {
        self.sst
            .members()
            .iter()
            .enumerate()
            .map(|(row, &m)| {
                let suspected = m != self.fabric.member() && self.fabric.is_suspected(m);
                (m, self.sst.counter(row, self.heartbeat), suspected)
            })
            .collect()
    }
}

impl<F: Fabric + Send> Agent for HeartbeatAgent<F> {
    fn name(&self) -> &str {
        "heartbeat"
    }

    fn do_work(&mut self, now_ns: u64) -> usize {
        let mut work = 0;
        if now_ns >= self.next_beat_ns {
            self.next_beat_ns = now_ns + self.interval_ns;
            self.beats += 1;
            self.sst.set_counter(self.heartbeat, self.beats);
            let (offset, len) = self.sst.range(self.heartbeat);
            for i in 0..self.peers.len() {
                let peer = self.peers[i];
                if self.fabric.is_suspected(peer) {
                    let _ = self.fabric.reconnect(peer);
                    continue;
                }
                let tag = WriteTag(self.beats as u64);
                match self.fabric.post_write(Write::signaled(peer, offset, len, tag)) {
                    Ok(()) | Err(PostError::PeerSuspected(_)) | Err(PostError::Backpressure(_)) => {}
                    Err(e) => panic!("heartbeat write is always valid: {e}"),
                }
            }
            work += 1;
        }
        self.fabric.poll_events(&mut self.events);
        for e in self.events.drain(..) {
            if !matches!(e, FabricEvent::Completed { .. }) {
                tracing::info!(?e, "fabric event");
                if self.log.len() < Self::LOG_LIMIT {
                    self.log.push((now_ns, e));
                } else {
                    self.log_dropped += 1;
                }
                work += 1;
            }
        }
        work
    }

    fn doorbell(&self) -> Option<Doorbell> {
        self.fabric.doorbell().cloned()
    }
}

/// The lowest port [`unused_local_port`] and
/// [`crate::node::free_base_port`] hand out (they stay below the ephemeral
/// range, and above the well-known and common service ports).
pub(crate) const LOCAL_PORT_FLOOR: u16 = 10_000;

/// The first port of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`; 32768 where it cannot be read).
pub(crate) fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
}

/// A port on 127.0.0.1, free for TCP and UDP when asked, chosen **below
/// the kernel's ephemeral range** (`/proc/sys/net/ipv4/ip_local_port_range`,
/// 32768-60999 by default): a port the kernel hands out for "bind to port
/// 0" is also a candidate for any outgoing connection's source port, so a
/// member that listens on one some time after it was picked can find it
/// taken by another member's connection ("Address already in use", seen in
/// a multi-process test). Successive calls in one process return distinct
/// ports (a stride through the range from a per-process start), so a
/// cluster's ports can be picked before anything binds them. For tests and
/// local clusters; another process may still take the port in between.
pub fn unused_local_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const FLOOR: u32 = LOCAL_PORT_FLOOR as u32;
    let ephemeral_low = ephemeral_low();
    if ephemeral_low <= FLOOR + 1_000 {
        // No room below the ephemeral range: the kernel's choice.
        return std::net::TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port());
    }
    let span = ephemeral_low - FLOOR;
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    // A prime stride that does not divide the span (two primes cannot both
    // divide a span under 65,536): the walk visits every port of the range
    // before repeating.
    let stride = if span.is_multiple_of(7_919) { 7_907 } else { 7_919 };
    for _ in 0..span.min(4_096) {
        let k = CALLS.fetch_add(1, Ordering::Relaxed) % span;
        let port = (FLOOR + (start + k * stride % span) % span) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "no free port below the ephemeral range"))
}

#[cfg(test)]
mod port_tests {
    use super::unused_local_port;

    /// Ports come from below the ephemeral range, each bindable when
    /// handed out, and successive ones differ (a cluster's ports are picked
    /// before anything binds them).
    #[test]
    fn unused_local_ports_are_distinct_and_below_the_ephemeral_range() {
        let low = u16::try_from(super::ephemeral_low()).unwrap_or(u16::MAX);
        let ports: Vec<u16> = (0..64).map(|_| unused_local_port().expect("a free port")).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        if low > 11_000 {
            assert!(ports.iter().all(|p| *p >= 10_000 && *p < low), "{ports:?} (ephemeral from {low})");
        }
        let p = ports[0];
        assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok(), "port {p} is free for TCP");
        assert!(std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok(), "port {p} is free for UDP");
    }

    /// A local cluster's whole port layout (base .. base+400+n) lies below
    /// the ephemeral range, and is free when picked.
    #[test]
    fn a_cluster_base_port_lays_every_port_below_the_ephemeral_range() {
        let low = u32::from(u16::try_from(super::ephemeral_low()).unwrap_or(u16::MAX));
        for _ in 0..16 {
            let base = u32::from(crate::node::free_base_port(3).expect("a free base"));
            if low > 11_000 {
                assert!(base >= 10_000 && base + 402 < low, "base {base} (ephemeral from {low})");
            }
            for o in [0, 100, 200, 300] {
                assert!(std::net::TcpListener::bind(("127.0.0.1", (base + o) as u16)).is_ok());
            }
            assert!(std::net::UdpSocket::bind(("127.0.0.1", (base + 400) as u16)).is_ok());
        }
    }
}
