//! [`OfiFabric`]: the [`Fabric`] over a libfabric endpoint (reliable
//! datagrams or connections).

use crate::contact::{self, Card, Contact, ContactError};
use crate::sys::{CmEvent, Completion, Endpoint, EndpointType, OfiError, Posted, ProviderAttr, WriteFlags};
use ordo_fabric::{
    Doorbell, Fabric, FabricEvent, FailureCause, MemberId, PartialPost, PostError, ReconnectError, Region,
    Write, WriteTag, check_range,
};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a member's ofi endpoint is set up.
#[derive(Clone, Debug)]
pub struct OfiOptions {
    /// This member's id.
    pub member: MemberId,
    /// The libfabric provider: `"tcp;ofi_rxm"`, `"shm"`, `"verbs;ofi_rxm"`,
    /// ... (any that offers `FI_EP_RDM` with `FI_RMA`), or with
    /// [`EndpointType::Msg`] `"verbs"` or `"tcp"`.
    pub provider: String,
    /// Reliable datagrams (default) or connections.
    pub endpoint: EndpointType,
    /// Length of every member's region (a positive multiple of 64).
    pub region_len: usize,
    /// The set-up (contact) address this member listens on; port 0 picks
    /// one (see [`OfiBinding::contact_addr`]).
    pub listen: SocketAddr,
    /// Every other member's contact address.
    pub peers: Vec<(MemberId, SocketAddr)>,
    /// Cluster name: members of different clusters refuse each other.
    pub cluster: String,
    /// The cluster secret, proved both ways before a member's address and
    /// memory key are given out. `None` runs unauthenticated (a public key;
    /// closed test networks only).
    pub secret: Option<ordo_auth::Secret>,
    /// A signaled write not completed within this time fails and its peer
    /// is suspected.
    pub write_timeout: Duration,
    /// How long start-up waits for every peer's contact.
    pub connect_timeout: Duration,
    /// Deadline of each read of the set-up handshake.
    pub handshake_timeout: Duration,
    /// Start with peers that do not answer within `connect_timeout`
    /// suspected, rather than failing (a new view's endpoint).
    pub suspect_missing_peers: bool,
}

impl OfiOptions {
    /// Options with defaults: 1 s write timeout, 10 s connect timeout.
    pub fn new(member: MemberId, provider: &str, listen: SocketAddr, region_len: usize) -> OfiOptions {
        OfiOptions {
            member,
            provider: provider.to_string(),
            endpoint: EndpointType::Rdm,
            region_len,
            listen,
            peers: Vec::new(),
            cluster: "ordo".into(),
            secret: None,
            write_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(2),
            suspect_missing_peers: false,
        }
    }

    fn key(&self) -> ordo_auth::Key {
        match &self.secret {
            Some(s) => s.derive(contact::KEY_LABEL),
            None => ordo_auth::Secret::from_bytes(UNAUTHENTICATED_SECRET)
                .expect("a 16+ byte constant")
                .derive(contact::KEY_LABEL),
        }
    }
}

/// What keys the set-up handshake without a secret: public, so anyone who
/// reaches a contact port learns the member's address and memory key.
const UNAUTHENTICATED_SECRET: &[u8] = b"ordo ofi fabric without a secret";

/// Why an ofi endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OfiFabricError {
    /// A libfabric call failed (the provider is missing, or refused).
    #[error(transparent)]
    Ofi(#[from] OfiError),
    /// A peer could not be reached or failed the set-up handshake.
    #[error(transparent)]
    Contact(#[from] ContactError),
    /// The options are inconsistent.
    #[error("bad ofi options: {0}")]
    Options(String),
    /// The contact listener could not start.
    #[error("ofi contact listener on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A bound, not yet connected endpoint: its contact port is open (peers may
/// fetch its card), its peers' cards not yet fetched.
pub struct OfiBinding {
    options: OfiOptions,
    attr: ProviderAttr,
    region: Region,
    shared: Arc<Shared>,
    progress: Option<JoinHandle<()>>,
    contact: Option<Contact>,
    incarnation: u64,
}

impl std::fmt::Debug for OfiBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfiBinding")
            .field("member", &self.options.member)
            .field("provider", &self.attr.provider)
            .field("contact", &self.contact.as_ref().map(|c| c.local_addr()))
            .finish()
    }
}

impl Drop for OfiBinding {
    fn drop(&mut self) {
        // A binding that connected handed its agent to the fabric.
        if self.progress.is_some() {
            stop_progress(&self.shared, &mut self.progress);
        }
    }
}

fn stop_progress(shared: &Shared, progress: &mut Option<JoinHandle<()>>) {
    shared.stop.store(true, Ordering::Release);
    if let Some(t) = progress.take() {
        let _ = t.join();
    }
}

impl OfiBinding {
    /// The contact address peers dial.
    pub fn contact_addr(&self) -> SocketAddr {
        self.contact.as_ref().expect("contact runs until connect").local_addr()
    }

    /// Fetches every peer's card (retrying until `connect_timeout`), inserts
    /// their addresses and starts the progress agent.
    pub fn connect(mut self, peers: Vec<(MemberId, SocketAddr)>) -> Result<OfiFabric, OfiFabricError> {
        let mut options = self.options.clone();
        options.peers = peers;
        options.peers.sort_by_key(|p| p.0);
        let me = options.member;
        if options.peers.iter().any(|p| p.0 == me) || options.peers.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(OfiFabricError::Options("peers must be distinct and exclude this member".into()));
        }
        let key = options.key();
        let cluster = contact::cluster_hash(&options.cluster);
        let deadline = Instant::now() + options.connect_timeout;
        for &(peer, addr) in &options.peers {
            let fetched = loop {
                match contact::fetch_card(addr, me, peer, cluster, &key, options.handshake_timeout) {
                    Ok(got) => break Some(got),
                    Err(e @ ContactError::Unreachable(..)) if Instant::now() < deadline => {
                        tracing::trace!(%e, peer, "ofi: peer not up yet");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(ContactError::Unreachable(..)) if options.suspect_missing_peers => break None,
                    Err(e) => return Err(e.into()),
                }
            };
            let mut link = Link::down(peer, addr);
            let mut core = self.shared.lock();
            let core = &mut *core;
            match fetched {
                Some((card, live)) => {
                    check_card(&card, options.region_len)?;
                    core.install(&mut link, card, live)?;
                }
                None => {
                    core.events.push(FabricEvent::Suspected { peer, cause: FailureCause::ConnectionLost })
                }
            }
            core.links.push(link);
        }
        // Connected endpoints: wait until every dialed connection is up.
        loop {
            let mut core = self.shared.lock();
            core.progress();
            if core.links.iter().all(|l| l.suspected || l.connected) {
                break;
            }
            let waiting: Vec<MemberId> = core.links.iter().filter(|l| !l.connected).map(|l| l.id).collect();
            drop(core);
            if Instant::now() > deadline {
                return Err(OfiFabricError::Options(format!(
                    "connections to members {waiting:?} never came up"
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Providers set up their connections on the first write (rxm) or
        // map the peer's queue (shm): a zero-length signaled write to each
        // peer does it now, so the first real write does not meet EAGAIN.
        //
        // On rxm the first write between two members must come from one
        // side only: when both connect at once, rxm resolves the collision
        // by dropping one of the two connections, and writes already sent
        // on it were lost without an error (seen: an Acuerdo follower's
        // ring skipping 35 entries, about once in 30 runs of the kill
        // test). So a member first waits (at most a second: a restarted
        // member's lower peers probe it only when they reconnect) for the
        // probe of every peer with a lower id, then probes.
        for link in 0..options.peers.len() {
            let mut core = self.shared.lock();
            if core.links[link].suspected {
                continue;
            }
            let peer = core.links[link].id;
            if core.one_sided_first_contact && peer < me {
                let wait_until = Instant::now() + Duration::from_secs(1);
                while !core.heard_from.contains(&peer) && Instant::now() < wait_until {
                    core.progress();
                    drop(core);
                    std::thread::sleep(Duration::from_micros(100));
                    core = self.shared.lock();
                }
            }
            drop(core);
            probe(&self.shared, link, WriteTag(u64::MAX), deadline)
                .map_err(|why| OfiFabricError::Options(format!("the first write to member {peer}: {why}")))?;
        }
        let fence = self.shared.lock().fence;
        tracing::info!(member = me, provider = %self.attr.provider, fabric = %self.attr.fabric, fence, manual_progress = self.attr.manual_progress, "ofi fabric up");
        let bell = self.shared.lock().bell.clone();
        Ok(OfiFabric {
            bell,
            peer_ids: options.peers.iter().map(|p| p.0).collect(),
            region: self.region.clone(),
            shared: self.shared.clone(),
            progress: self.progress.take(),
            contact: self.contact.take(),
            options,
            attr: self.attr.clone(),
            incarnation: self.incarnation,
            key,
        })
    }
}

fn check_card(card: &Card, region_len: usize) -> Result<(), OfiFabricError> {
    if card.region_len != region_len as u64 {
        return Err(OfiFabricError::Options(format!(
            "member {} has a region of {} bytes, this member {region_len}",
            card.member, card.region_len
        )));
    }
    Ok(())
}

/// Removes the region files libfabric's `shm` provider left in `dir`
/// (`/dev/shm`) for processes that no longer exist — a process killed with
/// SIGKILL never closes its endpoint. Its files are named
/// `<pid>:<domain>:<endpoint>`; only this user's files of dead pids are
/// removed (a peer that still maps one keeps its mapping). Returns how many.
pub fn remove_stale_shm_files(dir: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let mut parts = name.split(':');
        let (Some(pid), Some(d), Some(e), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(pid), true, true) = (
            pid.parse::<i32>(),
            d.bytes().all(|b| b.is_ascii_digit()),
            e.bytes().all(|b| b.is_ascii_digit()),
        ) else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        if !meta.file_type().is_file() || meta.uid() != uid || pid <= 0 {
            continue;
        }
        // SAFETY: signal 0 only checks that the process exists.
        let dead = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if dead && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

fn random_u64() -> u64 {
    let n = ordo_auth::handshake::nonce();
    u64::from_le_bytes(n[..8].try_into().expect("8 bytes"))
}

/// A member's endpoint on libfabric (see the crate docs for how each
/// guarantee is kept). Dropping it stops the progress agent, closes the
/// contact port (peers see [`FailureCause::PeerDead`]) and the endpoint.
pub struct OfiFabric {
    options: OfiOptions,
    bell: Option<Doorbell>,
    attr: ProviderAttr,
    peer_ids: Vec<MemberId>,
    region: Region,
    shared: Arc<Shared>,
    progress: Option<JoinHandle<()>>,
    contact: Option<Contact>,
    incarnation: u64,
    key: ordo_auth::Key,
}

impl std::fmt::Debug for OfiFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfiFabric")
            .field("member", &self.options.member)
            .field("provider", &self.attr.provider)
            .field("peers", &self.peer_ids)
            .field("incarnation", &self.incarnation)
            .finish()
    }
}

impl OfiFabric {
    /// Opens the endpoint, registers a fresh region and opens the contact
    /// port; call [`OfiBinding::connect`] once the peers' addresses are
    /// known.
    pub fn bind(options: OfiOptions) -> Result<OfiBinding, OfiFabricError> {
        if options.region_len == 0 || !options.region_len.is_multiple_of(64) {
            return Err(OfiFabricError::Options(format!(
                "region length {} is not a positive multiple of 64",
                options.region_len
            )));
        }
        if options.provider.split(';').any(|p| p == "shm") {
            // What killed processes left behind (as the shm backend does).
            remove_stale_shm_files(std::path::Path::new("/dev/shm"));
        }
        let region = Region::new_heap(options.region_len);
        // Connected endpoints listen on the contact address's host.
        let node = (options.endpoint == EndpointType::Msg && !options.listen.ip().is_unspecified())
            .then(|| options.listen.ip().to_string());
        // Writes are sent from a staging copy taken when they are posted;
        // room for two regions' worth in flight (at least 4 MiB).
        let staging = Region::new_heap((2 * options.region_len).max(4 << 20));
        let mut ep = Endpoint::open(
            &options.provider,
            options.endpoint,
            node.as_deref(),
            region.clone(),
            staging.clone(),
            random_u64(),
        )?;
        let name = ep.name()?;
        if name.len() > contact::MAX_NAME {
            return Err(OfiFabricError::Options(format!("provider address of {} bytes", name.len())));
        }
        let attr = ep.attr().clone();
        let incarnation = random_u64();
        let card = Card {
            member: options.member,
            incarnation,
            region_len: options.region_len as u64,
            base: region.as_ptr() as u64,
            key: attr.key,
            name,
        };
        let fence = match attr.write_after_write {
            Some(max) => max < options.region_len as u64,
            None => true,
        };
        let msg = ep.kind() == EndpointType::Msg;
        let core = Core {
            ep,
            msg,
            key: options.key(),
            incarnation,
            member: options.member,
            slots_free: (0..Endpoint::max_slots()).rev().collect(),
            bell: (attr.cq_data_size >= 4).then(Doorbell::new_local),
            send_endpoint_per_peer: !msg && attr.provider == "shm",
            one_sided_first_contact: !msg && attr.provider != "shm" && attr.cq_data_size >= 4,
            heard_from: std::collections::BTreeSet::new(),
            staging: Staging::new(staging.len()),
            staged: std::collections::HashMap::new(),
            accepted: Vec::new(),
            links: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            events: Vec::new(),
            comps: Vec::with_capacity(32),
            fence,
            write_timeout: options.write_timeout,
            last_check: Instant::now(),
        };
        let shared = Arc::new(Shared { core: Mutex::new(core), stop: AtomicBool::new(false) });
        let sh = shared.clone();
        let progress = std::thread::Builder::new()
            .name(format!("ofi-progress-{}", options.member))
            .spawn(move || progress_agent(&sh))
            .map_err(|e| OfiFabricError::Options(format!("cannot start the progress agent: {e}")))?;
        let contact = Contact::start(
            options.listen,
            card,
            contact::cluster_hash(&options.cluster),
            options.key(),
            options.handshake_timeout,
        );
        let contact = match contact {
            Ok(c) => c,
            Err(source) => {
                stop_progress(&shared, &mut Some(progress));
                return Err(OfiFabricError::Listen { addr: options.listen, source });
            }
        };
        if options.secret.is_none() {
            tracing::warn!(
                addr = %contact.local_addr(),
                "ofi fabric without a cluster secret: anyone who reaches the contact port learns this member's memory key"
            );
        }
        Ok(OfiBinding {
            options,
            attr,
            region,
            shared,
            progress: Some(progress),
            contact: Some(contact),
            incarnation,
        })
    }

    /// Binds and connects to `options.peers`.
    pub fn connect(options: OfiOptions) -> Result<OfiFabric, OfiFabricError> {
        let peers = options.peers.clone();
        OfiFabric::bind(options)?.connect(peers)
    }

    /// What the provider promised.
    pub fn provider(&self) -> &ProviderAttr {
        &self.attr
    }

    /// Whether writes to a peer wait for the previous one's completion (the
    /// provider does not promise write-after-write order).
    pub fn fenced(&self) -> bool {
        self.shared.lock().fence
    }

    /// This endpoint's incarnation (fresh per endpoint).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The contact address peers dial.
    pub fn contact_addr(&self) -> SocketAddr {
        self.contact.as_ref().expect("contact runs until drop").local_addr()
    }

    /// The options this endpoint runs with.
    pub fn options(&self) -> &OfiOptions {
        &self.options
    }

    fn index_of(&self, peer: MemberId) -> Option<usize> {
        self.peer_ids.binary_search(&peer).ok()
    }

    /// Fails the way a crashed process does, inside one process: progress
    /// stops and the contact port and liveness connections close (peers
    /// suspect this member), but the endpoint and its region are leaked
    /// rather than closed. Providers such as `shm` share their mappings of
    /// peers between the endpoints of one process, so closing an endpoint
    /// that a peer may still write to would pull memory from under that
    /// peer's write; a crashed process's memory outlives it the same way
    /// (the peer's mapping keeps it). For tests that kill members of an
    /// in-process group.
    pub fn crash(mut self) {
        stop_progress(&self.shared, &mut self.progress);
        self.contact.take();
        self.shared.lock().links.iter_mut().for_each(|l| l.live = None);
        std::mem::forget(self.shared.clone());
    }
}

impl Drop for OfiFabric {
    fn drop(&mut self) {
        stop_progress(&self.shared, &mut self.progress);
        // Closing the contact port and the liveness connections is how
        // peers learn that this member is gone.
        self.contact.take();
        self.shared.lock().links.iter_mut().for_each(|l| l.live = None);
    }
}

struct Shared {
    core: Mutex<Core>,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One write as the fabric hands it to the provider.
#[derive(Clone, Copy)]
struct Queued {
    offset: usize,
    len: usize,
    signal: Option<WriteTag>,
    /// Ring the peer's doorbell when it lands (the last write of a post).
    ring: bool,
}

struct Link {
    id: MemberId,
    contact: SocketAddr,
    suspected: bool,
    /// Reliable datagrams: the peer's address handle. Connections: the
    /// slot of the connection this member dialed (it writes on it).
    fi_addr: Option<u64>,
    /// Whether writes can go: always for datagrams once the address is
    /// in; for connections once the dialed connection is up.
    connected: bool,
    /// Reliable datagrams: the slot of this peer's own send endpoint
    /// (`None`: the main endpoint sends).
    send_slot: Option<usize>,
    key: u64,
    base: u64,
    incarnation: u64,
    live: Option<TcpStream>,
    /// Writes posted with a completion requested and not yet completed.
    in_flight: usize,
}

impl Link {
    fn down(id: MemberId, contact: SocketAddr) -> Link {
        Link {
            id,
            contact,
            suspected: true,
            fi_addr: None,
            connected: false,
            send_slot: None,
            key: 0,
            base: 0,
            incarnation: 0,
            live: None,
            in_flight: 0,
        }
    }
}

/// A write whose completion was requested: a slot in the table, named in
/// the write's context as `(generation << 24) | slot`.
struct Slot {
    generation: u64,
    pending: Option<Pending>,
}

#[derive(Clone, Copy)]
struct Pending {
    link: usize,
    tag: Option<WriteTag>,
    posted: Instant,
}

const SLOT_BITS: u32 = 24;
/// Context bit of writes posted without a completion (their errors still
/// come back); the low bits name the link.
const UNTRACKED: u64 = 1 << 63;

struct Core {
    ep: Endpoint,
    /// Connected endpoints (`FI_EP_MSG`).
    msg: bool,
    /// The set-up key (connection requests carry a MAC under it).
    key: ordo_auth::Key,
    incarnation: u64,
    member: MemberId,
    /// Free connection slots.
    slots_free: Vec<usize>,
    /// Rung when a peer's write lands (writes carry remote CQ data), where
    /// the provider can carry it.
    bell: Option<Doorbell>,
    /// Reliable datagrams on `shm`: every peer gets its own send endpoint.
    /// libfabric 1.17's `shm` returns an endpoint's completions in order,
    /// so with one endpoint a write outstanding to a peer that died (and
    /// never answers) held back the completion of every later write, and
    /// live peers timed out. Not done elsewhere: `rxm` reports a dead
    /// peer's writes as errors, and extra endpoints there crashed inside
    /// `fi_trywait` (which the progress agent blocks with).
    send_endpoint_per_peer: bool,
    /// rxm: the first write between two members comes from the lower id
    /// (see `OfiBinding::connect`).
    one_sided_first_contact: bool,
    /// Members whose writes (with remote CQ data) have landed here.
    heard_from: std::collections::BTreeSet<MemberId>,
    /// Where the bytes of writes in flight were captured.
    staging: Staging,
    /// Context of each write in flight → (its link, its staging chunk).
    /// A chunk is released only when the provider reports the write done
    /// (or the endpoint it was posted on is closed), never when its link
    /// merely goes down: the provider may still be reading it.
    staged: std::collections::HashMap<u64, (usize, u64)>,
    /// Connections peers dialed to write to this member (their slots).
    accepted: Vec<usize>,
    links: Vec<Link>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    events: Vec<FabricEvent>,
    comps: Vec<Completion>,
    /// Every write to a peer waits until the previous one completed.
    fence: bool,
    write_timeout: Duration,
    last_check: Instant,
}

enum Issue {
    Posted,
    Full,
    Failed,
}

/// A ring of byte chunks in the staging buffer, allocated at post time and
/// released (in any order) when their write completes; space is reclaimed
/// from the oldest chunk on.
struct Staging {
    len: usize,
    head: usize,
    used: usize,
    /// Chunks from the oldest: (start, length counted in `used`, done).
    chunks: std::collections::VecDeque<(usize, usize, bool)>,
    /// Id of `chunks[0]`.
    first_id: u64,
}

impl Staging {
    fn new(len: usize) -> Staging {
        Staging { len, head: 0, used: 0, chunks: std::collections::VecDeque::new(), first_id: 0 }
    }

    /// A contiguous chunk of `n` bytes: (id, start), or `None` when full.
    fn alloc(&mut self, n: usize) -> Option<(u64, usize)> {
        let n = n.next_multiple_of(64);
        if n > self.len {
            return None;
        }
        if self.chunks.is_empty() {
            self.head = 0;
        }
        let tail = self.chunks.front().map_or(0, |c| c.0);
        let (start, counted) = if self.chunks.is_empty() {
            (0, n)
        } else if self.head >= tail && self.used < self.len {
            // Free: [head, len) and [0, tail).
            if self.head + n <= self.len {
                (self.head, n)
            } else if n <= tail {
                (0, n + (self.len - self.head)) // the skipped end counts as used
            } else {
                return None;
            }
        } else if self.head < tail && self.head + n <= tail {
            (self.head, n)
        } else {
            return None;
        };
        if self.used + counted > self.len {
            return None;
        }
        self.used += counted;
        self.head = start + n;
        self.chunks.push_back((start, counted, false));
        Some((self.first_id + self.chunks.len() as u64 - 1, start))
    }

    fn release(&mut self, id: u64) {
        if let Some(i) = id.checked_sub(self.first_id)
            && let Some(c) = self.chunks.get_mut(i as usize)
        {
            c.2 = true;
        }
        while self.chunks.front().is_some_and(|c| c.2) {
            let (_, counted, _) = self.chunks.pop_front().expect("front");
            self.used -= counted;
            self.first_id += 1;
        }
    }
}

/// Most connections peers may hold open to one member.
const MAX_ACCEPTED: usize = 256;
/// Private data of a connection request: dialer id (4), dialer's
/// incarnation (8), acceptor's incarnation (8), MAC (16).
const CONNECT_PARAM: usize = 36;

fn connect_mac(key: &ordo_auth::Key, head: &[u8]) -> [u8; 32] {
    key.tag(&[b"ordo ofi connect v1", head])
}

impl Core {
    /// Points `link` at the peer of `card`: its address in the address
    /// vector (datagrams) or a new connection to its passive endpoint
    /// (connections; `connected` once the provider says so).
    fn install(&mut self, link: &mut Link, card: Card, live: TcpStream) -> Result<(), OfiError> {
        if self.msg {
            if let Some(old) = link.fi_addr.take() {
                self.ep.close_slot(old as usize);
                self.slots_free.push(old as usize);
            }
            let slot = self.slots_free.pop().ok_or_else(|| OfiError("no free connection slot".into()))?;
            let mut param = Vec::with_capacity(CONNECT_PARAM);
            param.extend_from_slice(&self.member.to_le_bytes());
            param.extend_from_slice(&self.incarnation.to_le_bytes());
            param.extend_from_slice(&card.incarnation.to_le_bytes());
            let mac = connect_mac(&self.key, &param);
            param.extend_from_slice(&mac[..16]);
            if let Err(e) = self.ep.connect(slot, &card.name, &param) {
                self.slots_free.push(slot);
                return Err(e);
            }
            link.fi_addr = Some(slot as u64);
            link.connected = false;
        } else {
            let fi_addr = self.ep.insert_peer(&card.name)?;
            if let Some(old) = link.fi_addr.replace(fi_addr)
                && old != fi_addr
            {
                self.ep.remove_peer(old);
            }
            // A fresh send endpoint for this peer (a dead incarnation's may
            // be stuck behind a write that will never complete).
            if let Some(old) = link.send_slot.take() {
                self.ep.close_slot(old);
                self.slots_free.push(old);
            }
            if self.send_endpoint_per_peer
                && let Some(slot) = self.slots_free.pop()
            {
                if self.ep.open_send_endpoint(slot)? {
                    link.send_slot = Some(slot);
                } else {
                    self.slots_free.push(slot);
                }
            }
            link.connected = true;
        }
        link.key = card.key;
        link.base = card.base;
        link.incarnation = card.incarnation;
        link.live = Some(live);
        link.suspected = false;
        Ok(())
    }

    /// Connection events: requests (accepted only with a valid MAC for
    /// this incarnation, at most [`MAX_ACCEPTED`]), dialed connections
    /// coming up, shutdowns and errors (a dialed one takes its link down).
    fn connection_events(&mut self) -> usize {
        let mut n = 0;
        loop {
            let event = match self.ep.event() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(%e, "ofi event queue failed");
                    break;
                }
            };
            n += 1;
            match event {
                CmEvent::Request { request, param } => {
                    let ok = param.len() == CONNECT_PARAM
                        && u64::from_le_bytes(param[12..20].try_into().expect("8 bytes")) == self.incarnation
                        && self.key.verify(&[b"ordo ofi connect v1", &param[..20]], &param[20..36]);
                    if !ok {
                        tracing::warn!("ofi: refused a connection request without a valid MAC");
                        self.ep.reject(request);
                    } else if self.accepted.len() >= MAX_ACCEPTED {
                        tracing::warn!("ofi: refused a connection request: {MAX_ACCEPTED} connections held");
                        self.ep.reject(request);
                    } else if let Some(slot) = self.slots_free.pop() {
                        match self.ep.accept(request, slot) {
                            Ok(()) => self.accepted.push(slot),
                            Err(e) => {
                                tracing::warn!(%e, "ofi: accepting a connection failed");
                                self.slots_free.push(slot);
                            }
                        }
                    } else {
                        self.ep.reject(request);
                    }
                }
                CmEvent::Connected { slot } => {
                    if let Some(l) = self.links.iter_mut().find(|l| l.fi_addr == Some(slot as u64)) {
                        l.connected = true;
                    }
                }
                CmEvent::Shutdown { slot } | CmEvent::Error { slot: Some(slot), .. } => {
                    if let Some(i) = self.links.iter().position(|l| l.fi_addr == Some(slot as u64)) {
                        self.fail_link(i, FailureCause::ConnectionLost);
                    } else if let Some(i) = self.accepted.iter().position(|s| *s == slot) {
                        self.accepted.swap_remove(i);
                        self.ep.close_slot(slot);
                        self.slots_free.push(slot);
                    }
                }
                CmEvent::Error { slot: None, err } => {
                    tracing::warn!(err = %crate::sys::strerror(err as i64), "ofi listener error");
                }
            }
        }
        n
    }

    fn remote_addr(&self, link: usize, offset: usize) -> u64 {
        if self.ep.attr().virt_addr { self.links[link].base + offset as u64 } else { offset as u64 }
    }

    fn alloc_slot(&mut self, p: Pending) -> Option<u64> {
        let i = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < (1 << SLOT_BITS) => {
                self.slots.push(Slot { generation: 0, pending: None });
                self.slots.len() - 1
            }
            None => return None,
        };
        let s = &mut self.slots[i];
        debug_assert!(s.pending.is_none());
        s.pending = Some(p);
        Some((s.generation << SLOT_BITS) | i as u64)
    }

    fn release_slot(&mut self, i: usize) -> Option<Pending> {
        let s = &mut self.slots[i];
        let p = s.pending.take();
        if p.is_some() {
            s.generation = (s.generation + 1) & ((1 << (63 - SLOT_BITS)) - 1);
            self.free.push(i);
        }
        p
    }

    /// A zero-length signaled write that completes on transmission: makes
    /// the provider set up its connection to the peer (rxm) at start-up.
    fn submit_probe(&mut self, link: usize, tag: WriteTag) -> Result<(), PostError> {
        // It carries remote CQ data (where there is a doorbell), which tells
        // the peer that this member has reached it.
        match self.issue(link, Queued { offset: 0, len: 0, signal: Some(tag), ring: true }, false) {
            Issue::Posted => Ok(()),
            Issue::Full => Err(PostError::Backpressure(self.links[link].id)),
            Issue::Failed => Err(PostError::PeerSuspected(self.links[link].id)),
        }
    }

    /// Hands one write to the provider. On `Full` nothing was posted.
    fn issue(&mut self, link: usize, w: Queued, delivery: bool) -> Issue {
        // Every write with bytes is sent from a copy taken now (providers
        // read their source when they transmit, which may be after the
        // caller stored a later value — a guard overtaking the data it
        // guards); its completion releases the copy.
        let stage = if w.len > 0 {
            match self.staging.alloc(w.len) {
                Some(s) => Some(s),
                None => {
                    self.reap();
                    match self.staging.alloc(w.len) {
                        Some(s) => Some(s),
                        None => return Issue::Full,
                    }
                }
            }
        } else {
            None
        };
        if let Some((_, start)) = stage {
            let region = self.ep.region();
            let staging = self.ep.staging();
            // SAFETY: both ranges lie inside their (distinct) buffers: the
            // write's range was checked against the region, the chunk was
            // allocated inside the staging buffer.
            unsafe {
                ordo_fabric::copy_untorn(staging.as_ptr().add(start), region.as_ptr().add(w.offset), w.len)
            };
        }
        let tracked = self.fence || w.signal.is_some() || stage.is_some();
        let context = if tracked {
            match self.alloc_slot(Pending { link, tag: w.signal, posted: Instant::now() }) {
                Some(c) => c,
                None => return Issue::Full,
            }
        } else {
            UNTRACKED | link as u64
        };
        let (dest, key) =
            (self.links[link].fi_addr.expect("an up link has an address"), self.links[link].key);
        let remote = self.remote_addr(link, w.offset);
        let ring = (w.ring && self.bell.is_some()).then_some(u64::from(self.member));
        let flags = WriteFlags { completion: tracked, delivery: tracked && delivery, ring };
        let mut tries = 0;
        loop {
            let staged_at = stage.map(|s| s.1);
            let via = self.links[link].send_slot;
            match self.ep.write(via, staged_at, w.offset, w.len, dest, remote, key, context, flags) {
                Ok(Posted::Yes) => {
                    if tracked {
                        self.links[link].in_flight += 1;
                    }
                    if let Some((id, _)) = stage {
                        self.staged.insert(context, (link, id));
                    }
                    return Issue::Posted;
                }
                Ok(Posted::Again) if tries < 2 => {
                    tries += 1;
                    self.reap();
                    if self.links[link].suspected {
                        self.unpost(context, tracked, stage);
                        return Issue::Failed;
                    }
                }
                Ok(Posted::Again) => {
                    self.unpost(context, tracked, stage);
                    return Issue::Full;
                }
                Err(e) => {
                    tracing::warn!(peer = self.links[link].id, %e, "ofi write refused; suspecting the peer");
                    self.unpost(context, tracked, stage);
                    self.fail_link(link, FailureCause::ConnectionLost);
                    return Issue::Failed;
                }
            }
        }
    }

    /// Undoes the bookkeeping of a write the provider did not take.
    fn unpost(&mut self, context: u64, tracked: bool, stage: Option<(u64, usize)>) {
        self.drop_context(context, tracked);
        if let Some((id, _)) = stage {
            self.staging.release(id);
        }
    }

    /// Releases the staging chunks of every write posted on `link`'s
    /// endpoint, which was just closed (the provider reads them no more).
    fn release_staged_of(&mut self, link: usize) {
        let ids: Vec<(u64, u64)> =
            self.staged.iter().filter(|(_, (l, _))| *l == link).map(|(c, (_, id))| (*c, *id)).collect();
        for (context, id) in ids {
            self.staged.remove(&context);
            self.staging.release(id);
        }
    }

    fn drop_context(&mut self, context: u64, tracked: bool) {
        if tracked {
            self.release_slot((context & ((1 << SLOT_BITS) - 1)) as usize);
        }
    }

    /// Posts one write (behind a fence, once the previous one landed).
    fn submit(&mut self, link: usize, w: Queued) -> Result<(), PostError> {
        let l = &self.links[link];
        if l.suspected {
            return Err(PostError::PeerSuspected(l.id));
        }
        if !l.connected {
            return Err(PostError::Backpressure(l.id));
        }
        if self.fence && l.in_flight > 0 {
            // Behind a fence a write waits until the previous one to this
            // peer has landed (bounded by the write timeout, which takes
            // the link down); its bytes are read when it is issued, now.
            let mut spins = 0u32;
            while self.links[link].in_flight > 0 {
                self.reap();
                self.check(Instant::now());
                if self.links[link].suspected {
                    return Err(PostError::PeerSuspected(self.links[link].id));
                }
                spins += 1;
                if spins > 64 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        match self.issue(link, w, true) {
            Issue::Posted => Ok(()),
            Issue::Full => Err(PostError::Backpressure(self.links[link].id)),
            Issue::Failed => Err(PostError::PeerSuspected(self.links[link].id)),
        }
    }

    /// Reads completions (driving the provider's progress) and applies them.
    fn reap(&mut self) -> usize {
        let mut comps = std::mem::take(&mut self.comps);
        let mut total = 0;
        loop {
            comps.clear();
            match self.ep.poll(&mut comps) {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) => {
                    tracing::error!(%e, "ofi completion queue failed");
                    break;
                }
            }
            for c in &comps {
                self.complete(*c);
            }
        }
        self.comps = comps;
        total
    }

    fn complete(&mut self, c: Completion) {
        if c.remote == 0
            && let Some((_, id)) = self.staged.remove(&c.context)
        {
            self.staging.release(id);
        }
        if c.remote != 0 && c.err == 0 {
            // A peer's write landed here: its data is in the region.
            if let Ok(peer) = MemberId::try_from(c.data) {
                self.heard_from.insert(peer);
            }
            if let Some(bell) = &self.bell {
                bell.ring();
            }
            return;
        }
        if c.context & UNTRACKED != 0 {
            // Only errors of untracked writes come back.
            let link = (c.context & !UNTRACKED) as usize;
            if c.err != 0 && link < self.links.len() {
                tracing::warn!(peer = self.links[link].id, err = %crate::sys::strerror(c.err as i64), "ofi write failed");
                self.fail_link(link, FailureCause::ConnectionLost);
            }
            return;
        }
        let slot = (c.context & ((1 << SLOT_BITS) - 1)) as usize;
        let generation = c.context >> SLOT_BITS;
        if slot >= self.slots.len() || self.slots[slot].generation != generation {
            return; // failed and reported already (its link went down)
        }
        let Some(p) = self.release_slot(slot) else { return };
        let peer = self.links[p.link].id;
        self.links[p.link].in_flight -= 1;
        if c.err != 0 {
            tracing::warn!(peer, err = %crate::sys::strerror(c.err as i64), prov_errno = c.prov_errno, "ofi write failed");
            if let Some(tag) = p.tag {
                self.events.push(FabricEvent::Failed { peer, tag, cause: FailureCause::ConnectionLost });
            }
            self.fail_link(p.link, FailureCause::ConnectionLost);
        } else if let Some(tag) = p.tag {
            self.events.push(FabricEvent::Completed { peer, tag });
        }
    }

    /// Takes a link down once: every pending signaled write fails, one
    /// `Suspected` is reported.
    fn fail_link(&mut self, link: usize, cause: FailureCause) {
        if self.links[link].suspected {
            return;
        }
        let peer = self.links[link].id;
        self.links[link].suspected = true;
        self.links[link].live = None;
        if self.msg
            && let Some(slot) = self.links[link].fi_addr.take()
        {
            self.ep.close_slot(slot as usize);
            self.slots_free.push(slot as usize);
            self.links[link].connected = false;
            self.release_staged_of(link);
        }
        if let Some(slot) = self.links[link].send_slot.take() {
            self.ep.close_slot(slot);
            self.slots_free.push(slot);
            self.release_staged_of(link);
        }
        self.events.push(FabricEvent::Suspected { peer, cause });
        for i in 0..self.slots.len() {
            if self.slots[i].pending.is_some_and(|p| p.link == link)
                && let Some(Pending { tag: Some(tag), .. }) = self.release_slot(i)
            {
                self.events.push(FabricEvent::Failed { peer, tag, cause: FailureCause::LinkDown });
            }
        }
        self.links[link].in_flight = 0;
    }

    /// Timeouts and liveness, at most once a millisecond.
    fn check(&mut self, now: Instant) {
        if now.duration_since(self.last_check) < Duration::from_millis(1) {
            return;
        }
        self.last_check = now;
        for link in 0..self.links.len() {
            let dead = match self.links[link].live.as_mut() {
                Some(s) => !contact::still_open(s),
                None => false,
            };
            if dead {
                self.fail_link(link, FailureCause::PeerDead);
            }
        }
        let timeout = self.write_timeout;
        for i in 0..self.slots.len() {
            if let Some(p) = self.slots[i].pending
                && now.duration_since(p.posted) > timeout
            {
                self.fail_link(p.link, FailureCause::TimedOut);
            }
        }
    }

    /// One round of progress. Returns whether anything happened.
    fn progress(&mut self) -> bool {
        let events = if self.msg { self.connection_events() } else { 0 };
        let reaped = self.reap();
        self.check(Instant::now());
        reaped + events > 0
    }

    fn busy(&self) -> bool {
        self.links.iter().any(|l| l.in_flight > 0)
    }
}

/// Posts a zero-length signaled write to `link` (retrying back-pressure)
/// and waits until it completes, by `deadline`: the provider has then set
/// up its path to the peer (rxm's connection, shm's mapping) and the
/// peer's doorbell data names this member. The probe's event is consumed.
fn probe(shared: &Shared, link: usize, tag: WriteTag, deadline: Instant) -> Result<(), String> {
    let mut posted = false;
    loop {
        let mut core = shared.lock();
        let peer = core.links[link].id;
        if !posted {
            match core.submit_probe(link, tag) {
                Ok(()) => posted = true,
                Err(PostError::Backpressure(_)) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        core.progress();
        let done = core.events.iter().position(|e| {
            matches!(e, FabricEvent::Completed { peer: p, tag: t } | FabricEvent::Failed { peer: p, tag: t, .. }
                if *p == peer && *t == tag)
        });
        if let Some(i) = done {
            return match core.events.remove(i) {
                FabricEvent::Completed { .. } => Ok(()),
                e => Err(format!("failed: {e:?}")),
            };
        }
        if core.links[link].suspected {
            return Err("the link went down".into());
        }
        drop(core);
        if Instant::now() > deadline {
            return Err(if posted { "never completed" } else { "never posted" }.into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// How long the progress agent keeps polling after its last work before it
/// blocks on the wait fd (or sleeps).
const SPIN_AFTER_WORK: Duration = Duration::from_micros(200);

/// Drives the provider's progress (incoming writes land only while someone
/// polls a manual-progress provider) and issues fenced writes: spins while
/// writes are in flight, backs off to 50 µs sleeps when idle.
fn progress_agent(shared: &Shared) {
    let mut idle = 0u32;
    let mut nap = 0u64;
    let mut last_work = Instant::now();
    let fd = shared.lock().ep.wait_fd();
    while !shared.stop.load(Ordering::Acquire) {
        let (worked, busy) = {
            let mut core = shared.lock();
            let w = core.progress();
            (w, core.busy())
        };
        if worked || busy {
            idle = 0;
            nap = 0;
            last_work = Instant::now();
            std::thread::yield_now();
            continue;
        }
        idle = idle.saturating_add(1);
        // Recently busy: keep polling (yielding the core) for a while, since
        // a wake-up from the wait fd costs tens of microseconds.
        if idle < 64 || last_work.elapsed() < SPIN_AFTER_WORK {
            std::thread::yield_now();
            continue;
        }
        // Idle: block on the completion queue's wait fd where the provider
        // has one (a peer's write with remote CQ data, or its socket
        // turning readable, wakes it), at most a millisecond (connection
        // events, liveness and timeouts are checked between waits).
        match fd {
            Some(fd) if shared.lock().ep.try_wait() => {
                let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd; the fd lives as long as the endpoint.
                unsafe { libc::poll(&mut p, 1, 1) };
            }
            Some(_) => {}
            // No wait fd (shm): naps growing by a microsecond up to 50.
            None => {
                nap = (nap + 1).min(50);
                std::thread::sleep(Duration::from_micros(nap));
            }
        }
    }
}

impl Fabric for OfiFabric {
    fn member(&self) -> MemberId {
        self.options.member
    }

    fn peers(&self) -> &[MemberId] {
        &self.peer_ids
    }

    fn region(&self) -> &Region {
        &self.region
    }

    fn post_write(&mut self, write: Write) -> Result<(), PostError> {
        check_range(write.offset, write.len, self.region.len())?;
        let link = self.index_of(write.peer).ok_or(PostError::UnknownPeer(write.peer))?;
        if write.len as u64 > self.attr.max_msg_size {
            return Err(PostError::TooLarge { len: write.len, max: self.attr.max_msg_size as usize });
        }
        self.shared
            .lock()
            .submit(link, Queued { offset: write.offset, len: write.len, signal: write.signal, ring: true })
    }

    fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
        let Some(link) = self.index_of(peer) else {
            return Err(PartialPost { posted: 0, error: PostError::UnknownPeer(peer) });
        };
        let mut core = self.shared.lock();
        for (posted, &(offset, len)) in ranges.iter().enumerate() {
            let r = check_range(offset, len, self.region.len()).and_then(|()| {
                if len as u64 > self.attr.max_msg_size {
                    return Err(PostError::TooLarge { len, max: self.attr.max_msg_size as usize });
                }
                core.submit(link, Queued { offset, len, signal: None, ring: posted + 1 == ranges.len() })
            });
            r.map_err(|error| PartialPost { posted, error })?;
        }
        Ok(())
    }

    fn poll_events(&mut self, events: &mut Vec<FabricEvent>) {
        let mut core = self.shared.lock();
        core.progress();
        events.append(&mut core.events);
    }

    fn doorbell(&self) -> Option<&Doorbell> {
        self.bell.as_ref()
    }

    fn is_suspected(&self, peer: MemberId) -> bool {
        self.index_of(peer).is_some_and(|i| self.shared.lock().links[i].suspected)
    }

    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        let link = self.index_of(peer).ok_or(ReconnectError::UnknownPeer(peer))?;
        let addr = {
            let core = self.shared.lock();
            let l = &core.links[link];
            if !l.suspected {
                return Ok(l.incarnation);
            }
            l.contact
        };
        let cluster = contact::cluster_hash(&self.options.cluster);
        let timeout = self.options.handshake_timeout.min(Duration::from_millis(500));
        let (card, live) = contact::fetch_card(addr, self.options.member, peer, cluster, &self.key, timeout)
            .map_err(|e| ReconnectError::Unreachable(peer, e.to_string()))?;
        check_card(&card, self.options.region_len)
            .map_err(|e| ReconnectError::Unreachable(peer, e.to_string()))?;
        let incarnation = card.incarnation;
        let mut core = self.shared.lock();
        let mut l = std::mem::replace(&mut core.links[link], Link::down(peer, addr));
        let installed = core.install(&mut l, card, live);
        core.links[link] = l;
        installed.map_err(|e| ReconnectError::Unreachable(peer, e.to_string()))?;
        // A connection must come up before the link counts as back.
        let deadline = Instant::now() + timeout;
        while !core.links[link].connected {
            core.progress();
            if core.links[link].suspected || Instant::now() > deadline {
                core.fail_link(link, FailureCause::ConnectionLost);
                core.events.retain(|e| !matches!(e, FabricEvent::Suspected { peer: p, .. } if *p == peer));
                return Err(ReconnectError::Unreachable(peer, "the connection did not come up".into()));
            }
            drop(core);
            std::thread::sleep(Duration::from_micros(200));
            core = self.shared.lock();
        }
        // And the provider must have set up its path to the new
        // incarnation (a zero-length write completing), so the caller's
        // first write does not meet back-pressure.
        drop(core);
        let probed = probe(&self.shared, link, WriteTag(u64::MAX - 1), deadline);
        let mut core = self.shared.lock();
        if let Err(why) = probed {
            // Back down, without a second suspicion or failure report.
            core.fail_link(link, FailureCause::ConnectionLost);
            core.events.retain(|e| {
                !matches!(e, FabricEvent::Suspected { peer: p, .. } | FabricEvent::Failed { peer: p, .. }
                    if *p == peer)
            });
            return Err(ReconnectError::Unreachable(peer, format!("the first write: {why}")));
        }
        core.events.push(FabricEvent::Reconnected { peer, incarnation });
        Ok(incarnation)
    }
}

#[cfg(test)]
mod tests {
    use super::Staging;

    #[test]
    fn staging_allocates_contiguously_and_reclaims_from_the_oldest() {
        let mut s = Staging::new(1024);
        let (a, pa) = s.alloc(300).unwrap(); // 320 bytes
        let (b, pb) = s.alloc(300).unwrap();
        let (c, pc) = s.alloc(300).unwrap();
        assert_eq!((pa, pb, pc), (0, 320, 640));
        assert!(s.alloc(200).is_none(), "only 64 bytes left at the end");
        // Released out of order: nothing is reclaimed until the oldest is.
        s.release(b);
        assert!(s.alloc(200).is_none());
        s.release(a);
        // [0, 640) free now; the end (64 bytes) cannot hold 200: wrap to 0.
        let (d, pd) = s.alloc(200).unwrap();
        assert_eq!(pd, 0);
        assert!(s.alloc(500).is_none(), "[256, 640) holds 384 bytes");
        let (_, pe) = s.alloc(300).unwrap();
        assert_eq!(pe, 256);
        s.release(c);
        s.release(d);
        assert!(s.alloc(1024).is_none(), "one chunk still in use");
        assert!(s.alloc(2048).is_none(), "larger than the buffer");
    }

    #[test]
    fn staging_empties_completely() {
        let mut s = Staging::new(4096);
        let ids: Vec<u64> = (0..64).map(|_| s.alloc(64).unwrap().0).collect();
        assert!(s.alloc(64).is_none());
        for id in ids.into_iter().rev() {
            s.release(id);
        }
        assert_eq!(s.alloc(4096).unwrap().1, 0);
    }
}
