//! The `shm` fabric backend: members are processes (or threads) on one host.
//!
//! Each member owns a file `<dir>/ordo-<cluster>-m<id>.region` (in `/dev/shm`
//! by default) that every member maps. A write is a copy straight into the
//! peer's mapping ([`ordo_fabric::copy_untorn`]) followed by the peer's
//! doorbell ring (a `SeqCst` fence and one load; a `futex_wake` only if the
//! peer is parked). There is no syscall on the data path.
//!
//! # File layout
//! ```text
//! offset 0     +---------------------------------------------+
//!              | magic u64 | version u32 | member u32          |  0..16
//!              | region_len u64 | incarnation u64             | 16..32
//!              | pid u32 | doorbell_owner u32 | state u32     | 32..44
//! offset 128   | DoorbellWords { seq u32, waiters u32 } (64 B) |
//! offset 4096  +---------------------------------------------+
//!              | region: region_len bytes (the Fabric region) |
//!              +---------------------------------------------+
//! ```
//!
//! # Invariants
//! - **Liveness lock.** The owner holds an exclusive `flock` on its file for
//!   its whole life; the kernel drops it when the process dies, however it
//!   dies (SIGKILL included). A peer whose lock can be taken is dead. Checks
//!   are syscalls, so they run at most once per `liveness_check_interval`
//!   per peer, from [`Fabric::poll_events`], never on the data path.
//! - **New incarnation, new inode.** A restarting member unlinks a stale file
//!   (one whose lock is free) and creates a new one, so peers still mapping
//!   the old inode see it dead instead of writing into the new incarnation.
//! - **Published when ready.** The header's `state` is set to READY with a
//!   Release store after the header is complete; peers map a file only after
//!   an Acquire load sees READY and the lock held.
//! - **FIFO and untorn.** Writes are applied synchronously, in posting order,
//!   by word-atomic copies, so guarantees 1-3 of `ordo-fabric` hold.
//! - **Signaled writes** are applied at post time; `poll_events` reports
//!   them `Completed` unless the peer's latest liveness check (at most
//!   `liveness_check_interval` old) found it dead, in which case they fail
//!   with `PeerDead` (and the peer is suspected once; the link stays down
//!   until [`Fabric::reconnect`]). At most [`MAX_PENDING_SIGNALED`] wait to
//!   be reported; beyond that, signaled posts return back-pressure.
//! - **Doorbell words** count parked waiters; a process killed while parked
//!   leaves its count behind, which only costs ringers a futex-wake syscall
//!   until that region file is replaced.
//! - **Doorbell.** A member parks on the doorbell in the header of its
//!   `doorbell_owner` (itself by default); members driven by one thread in the
//!   shared threading mode name the same owner, so one futex wakes them all.

#![warn(missing_docs)]

use memmap2::{MmapOptions, MmapRaw};
use ordo_fabric::{
    Doorbell, DoorbellWords, Fabric, FabricEvent, FailureCause, MemberId, PartialPost, PostError,
    ReconnectError, Region, Write, WriteTag, check_range, copy_untorn,
};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Bytes before the region in each file.
pub const HEADER_LEN: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"ordoSHM1");
const VERSION: u32 = 1;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_MEMBER: usize = 12;
const OFF_REGION_LEN: usize = 16;
const OFF_INCARNATION: usize = 24;
const OFF_PID: usize = 32;
const OFF_DOORBELL_OWNER: usize = 36;
const OFF_STATE: usize = 40;
const OFF_DOORBELL: usize = 128;
const STATE_READY: u32 = 1;
/// Signaled writes whose completion `poll_events` has not reported yet;
/// beyond it signaled posts return back-pressure (bounded memory).
pub const MAX_PENDING_SIGNALED: usize = 65_536;

const _: () = assert!(OFF_DOORBELL.is_multiple_of(64) && OFF_DOORBELL + 64 <= HEADER_LEN);
const _: () = assert!(HEADER_LEN.is_multiple_of(4096), "the region must start page-aligned");

/// How to create a member's endpoint on the shm fabric.
#[derive(Clone, Debug)]
pub struct ShmOptions {
    /// Directory of the region files (a tmpfs: `/dev/shm`).
    pub dir: PathBuf,
    /// Name shared by the members of one group; separates groups on a host.
    pub cluster: String,
    /// This member.
    pub member: MemberId,
    /// Every member of the group, this one included.
    pub members: Vec<MemberId>,
    /// Region length in bytes (same on every member; a multiple of 64).
    pub region_len: usize,
    /// Member whose header holds the doorbell this member parks on.
    pub doorbell_owner: Option<MemberId>,
    /// How long [`ShmFabric::create`] waits for every peer's file.
    pub open_timeout: Duration,
    /// Minimum time between two liveness checks of one peer.
    pub liveness_check_interval: Duration,
    /// A peer whose file is not ready within `open_timeout` is suspected
    /// (a [`FabricEvent::Suspected`] on the first poll, posts to it refused)
    /// instead of failing [`ShmFabric::create`] — for a new view whose
    /// member may have died after the view was decided. Default false.
    pub suspect_missing_peers: bool,
}

impl ShmOptions {
    /// Options with defaults: `/dev/shm`, 10 s open timeout, 1 ms liveness.
    pub fn new(
        cluster: impl Into<String>,
        member: MemberId,
        members: Vec<MemberId>,
        region_len: usize,
    ) -> Self {
        ShmOptions {
            dir: PathBuf::from("/dev/shm"),
            cluster: cluster.into(),
            member,
            members,
            region_len,
            doorbell_owner: None,
            open_timeout: Duration::from_secs(10),
            liveness_check_interval: Duration::from_millis(1),
            suspect_missing_peers: false,
        }
    }

    /// The region file of `member`.
    pub fn path_of(&self, member: MemberId) -> PathBuf {
        region_path(&self.dir, &self.cluster, member)
    }
}

/// The region file of `member` of `cluster` in `dir`.
pub fn region_path(dir: &Path, cluster: &str, member: MemberId) -> PathBuf {
    dir.join(format!("ordo-{cluster}-m{member}.region"))
}

/// Errors creating or connecting an shm endpoint (operator or environment
/// faults; never a bug).
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The options are inconsistent.
    #[error("invalid shm options: {0}")]
    BadOptions(String),
    /// A live process already owns this member's file.
    #[error("member {member} is already running (its region file {path} is locked)")]
    AlreadyRunning {
        /// The member this endpoint was to be.
        member: MemberId,
        /// Its region file, locked by another live process.
        path: PathBuf,
    },
    /// A peer's file did not become ready in time.
    #[error("peer {member} did not become ready within {timeout:?} ({path}): {why}")]
    PeerNotReady {
        /// The peer that was not ready.
        member: MemberId,
        /// The peer's region file.
        path: PathBuf,
        /// How long was waited (the `open_timeout` option).
        timeout: Duration,
        /// Why the last attempt to open the file failed.
        why: String,
    },
    /// A peer's region file (or the region directory) is not one only this
    /// user controls: a link, another user's file, a file others may read
    /// or write, or a world-writable directory without the sticky bit.
    /// Nothing of it was mapped.
    #[error("refusing region file {path} of peer {member}: {why}")]
    Untrusted {
        /// The peer whose file it is (this member for the directory).
        member: MemberId,
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A file system or mapping call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done, e.g. "creating region file".
        what: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Why a peer's file could not be mapped (yet).
enum PeerOpenError {
    /// Not there, not ready, or not of this group yet: try again.
    NotYet(String),
    /// Not a file only this user controls: never mapped.
    Untrusted(String),
}

impl std::fmt::Display for PeerOpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerOpenError::NotYet(why) | PeerOpenError::Untrusted(why) => f.write_str(why),
        }
    }
}

/// A region file may be mapped only if it is a regular file with one link,
/// owned by this user, with no access for group or others (how members
/// create them): otherwise another local user could plant or share it.
fn check_owned_and_private(meta: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.uid() != me {
        return Err(format!("it is owned by uid {}, not by this user (uid {me})", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!("its mode is {:o}; region files are 600", meta.mode() & 0o777));
    }
    if meta.nlink() != 1 {
        return Err(format!("it has {} hard links; region files have one", meta.nlink()));
    }
    Ok(())
}

/// The region directory must not let other users replace files in it: a
/// directory anyone may write to needs the sticky bit (as `/dev/shm` has).
fn check_directory(options: &ShmOptions) -> Result<(), ShmError> {
    let meta = std::fs::metadata(&options.dir).map_err(io_err("reading region directory", &options.dir))?;
    if meta.mode() & 0o002 != 0 && meta.mode() & 0o1000 == 0 {
        return Err(ShmError::Untrusted {
            member: options.member,
            path: options.dir.clone(),
            why: format!(
                "the directory's mode is {:o}: anyone may write to it and it has no sticky bit, so another user could replace region files (chmod +t, or another directory)",
                meta.mode() & 0o7777
            ),
        });
    }
    Ok(())
}

/// A mapped region file (own or a peer's).
struct Mapping {
    file: File,
    map: MmapRaw,
    inode: u64,
    incarnation: u64,
}

impl Mapping {
    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn header_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: offsets are inside the header page, 4-aligned.
        unsafe { &*(self.base().add(off) as *const AtomicU32) }
    }

    fn header_u64(&self, off: usize) -> u64 {
        // SAFETY: offsets are inside the header page, 8-aligned.
        unsafe { std::ptr::read_volatile(self.base().add(off) as *const u64) }
    }

    fn doorbell_words(&self) -> NonNull<DoorbellWords> {
        // SAFETY: inside the header page and 64-aligned (const-asserted).
        unsafe { NonNull::new_unchecked(self.base().add(OFF_DOORBELL) as *mut DoorbellWords) }
    }

    fn region_ptr(&self) -> *mut u8 {
        // SAFETY: the mapping is HEADER_LEN + region_len long.
        unsafe { self.base().add(HEADER_LEN) }
    }

    /// Whether the owning process still holds the liveness lock.
    fn owner_alive(&self) -> bool {
        let fd = self.file.as_raw_fd();
        // SAFETY: plain syscall on a descriptor we own.
        let r = unsafe { libc::flock(fd, libc::LOCK_SH | libc::LOCK_NB) };
        if r == 0 {
            // SAFETY: as above; we only probed.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
            false
        } else {
            true
        }
    }
}

/// The owner side of a mapping: unlinks its file when dropped.
struct OwnFile {
    mapping: Mapping,
    path: PathBuf,
}

impl Drop for OwnFile {
    fn drop(&mut self) {
        // Unlink only if the path still names our inode.
        if let Ok(meta) = std::fs::metadata(&self.path)
            && meta.ino() == self.mapping.inode
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

struct PeerLink {
    id: MemberId,
    /// None only for a peer that was missing at creation
    /// ([`ShmOptions::suspect_missing_peers`]); such a link is suspected.
    mapping: Option<Arc<Mapping>>,
    /// The mapping that holds the doorbell this peer parks on.
    bell: Option<Doorbell>,
    suspected: bool,
    last_check: Instant,
}

/// A member's endpoint on the shm fabric. See the crate docs.
pub struct ShmFabric {
    options: ShmOptions,
    own: Arc<OwnFile>,
    region: Region,
    doorbell: Doorbell,
    peer_ids: Vec<MemberId>,
    links: Vec<PeerLink>,
    pending: std::collections::VecDeque<(MemberId, WriteTag)>,
    events: Vec<FabricEvent>,
    last_sweep: Instant,
    polls_since_sweep: u32,
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ShmError + 'a {
    move |source| ShmError::Io { what, path: path.to_path_buf(), source }
}

fn try_lock(file: &File, how: libc::c_int) -> bool {
    // SAFETY: plain syscall on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) == 0 }
}

fn new_incarnation() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    (t as u64) ^ (u64::from(std::process::id()) << 40)
}

impl ShmFabric {
    /// Creates this member's region file, then maps every peer's file once it
    /// is ready (waiting up to `open_timeout`).
    pub fn create(options: ShmOptions) -> Result<ShmFabric, ShmError> {
        check_directory(&options)?;
        let mut peer_ids: Vec<MemberId> =
            options.members.iter().copied().filter(|m| *m != options.member).collect();
        peer_ids.sort_unstable();
        peer_ids.dedup();
        if !options.members.contains(&options.member) {
            return Err(ShmError::BadOptions(format!(
                "member {} is not in {:?}",
                options.member, options.members
            )));
        }
        if options.region_len == 0 || !options.region_len.is_multiple_of(64) {
            return Err(ShmError::BadOptions(format!(
                "region_len {} must be a positive multiple of 64",
                options.region_len
            )));
        }
        let bell_owner = options.doorbell_owner.unwrap_or(options.member);
        if !options.members.contains(&bell_owner) {
            return Err(ShmError::BadOptions(format!("doorbell owner {bell_owner} is not a member")));
        }
        let own = Arc::new(Self::create_own(&options, bell_owner)?);
        // SAFETY: the mapping is region_len bytes past the header and lives
        // as long as `own`, which the Region keeps alive.
        let region = unsafe {
            Region::from_raw(
                NonNull::new(own.mapping.region_ptr()).expect("mapped"),
                options.region_len,
                own.clone(),
            )
        };
        let mut fabric = ShmFabric {
            doorbell: unsafe {
                Doorbell::from_raw(own.mapping.doorbell_words(), own.clone(), own.mapping.inode)
            },
            options,
            own,
            region,
            peer_ids: peer_ids.clone(),
            links: Vec::with_capacity(peer_ids.len()),
            pending: Default::default(),
            events: Vec::new(),
            last_sweep: Instant::now(),
            polls_since_sweep: 0,
        };
        let deadline = Instant::now() + fabric.options.open_timeout;
        for &peer in &peer_ids {
            let (mapping, suspected) = match fabric.open_peer(peer, deadline) {
                Ok(m) => (Some(Arc::new(m)), false),
                Err(ShmError::PeerNotReady { .. })
                    if fabric.options.suspect_missing_peers && peer != bell_owner =>
                {
                    let cause = FailureCause::TimedOut;
                    tracing::warn!(member = fabric.options.member, peer, %cause, "peer missing at creation; suspected");
                    fabric.events.push(FabricEvent::Suspected { peer, cause });
                    (None, true)
                }
                Err(e) => return Err(e),
            };
            fabric.links.push(PeerLink {
                id: peer,
                mapping,
                bell: None,
                suspected,
                last_check: Instant::now(),
            });
        }
        // Resolve each peer's doorbell (it may live in a third member's header).
        for i in 0..fabric.links.len() {
            let bell = fabric.links[i].mapping.as_ref().and_then(|m| fabric.bell_of(m));
            fabric.links[i].bell = bell;
        }
        // Our own bell, if another member owns it, lives in that mapping.
        if bell_owner != fabric.options.member {
            let m = fabric
                .links
                .iter()
                .find(|l| l.id == bell_owner)
                .and_then(|l| l.mapping.clone())
                .expect("the doorbell owner is a peer that was opened");
            // SAFETY: the words live in the peer's mapping, which `m` keeps alive.
            fabric.doorbell = unsafe { Doorbell::from_raw(m.doorbell_words(), m.clone(), m.inode) };
        }
        Ok(fabric)
    }

    fn create_own(options: &ShmOptions, bell_owner: MemberId) -> Result<OwnFile, ShmError> {
        let path = options.path_of(options.member);
        // A file left by a dead incarnation is unlinked; a live one is an error.
        if let Ok(existing) =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(&path)
        {
            // A peer's liveness probe holds a shared lock for an instant;
            // retry briefly before concluding the owner is alive.
            let mut locked = false;
            for _ in 0..20 {
                if try_lock(&existing, libc::LOCK_EX) {
                    locked = true;
                    break;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            if !locked {
                return Err(ShmError::AlreadyRunning { member: options.member, path });
            }
            std::fs::remove_file(&path).map_err(io_err("removing stale region file", &path))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io_err("creating region file", &path))?;
        if !try_lock(&file, libc::LOCK_EX) {
            return Err(ShmError::AlreadyRunning { member: options.member, path });
        }
        file.set_len((HEADER_LEN + options.region_len) as u64)
            .map_err(io_err("sizing region file", &path))?;
        let map = MmapOptions::new().map_raw(&file).map_err(io_err("mapping region file", &path))?;
        let inode = file.metadata().map_err(io_err("stat of region file", &path))?.ino();
        let incarnation = new_incarnation();
        let mapping = Mapping { file, map, inode, incarnation };
        // SAFETY: header offsets are in bounds and aligned; no one reads the
        // header before `state` is READY.
        unsafe {
            let b = mapping.base();
            std::ptr::write_volatile(b.add(OFF_MAGIC) as *mut u64, MAGIC);
            std::ptr::write_volatile(b.add(OFF_VERSION) as *mut u32, VERSION);
            std::ptr::write_volatile(b.add(OFF_MEMBER) as *mut u32, options.member);
            std::ptr::write_volatile(b.add(OFF_REGION_LEN) as *mut u64, options.region_len as u64);
            std::ptr::write_volatile(b.add(OFF_INCARNATION) as *mut u64, incarnation);
            std::ptr::write_volatile(b.add(OFF_PID) as *mut u32, std::process::id());
            std::ptr::write_volatile(b.add(OFF_DOORBELL_OWNER) as *mut u32, bell_owner);
        }
        mapping.header_u32(OFF_STATE).store(STATE_READY, Ordering::Release);
        Ok(OwnFile { mapping, path })
    }

    /// Maps `peer`'s file once it is ready and its owner alive.
    fn open_peer(&self, peer: MemberId, deadline: Instant) -> Result<Mapping, ShmError> {
        let path = self.options.path_of(peer);
        loop {
            let why = match self.try_open_peer(peer, &path) {
                Ok(m) => return Ok(m),
                Err(PeerOpenError::Untrusted(why)) => {
                    return Err(ShmError::Untrusted { member: peer, path, why });
                }
                Err(PeerOpenError::NotYet(e)) => e,
            };
            if Instant::now() >= deadline {
                return Err(ShmError::PeerNotReady {
                    member: peer,
                    path,
                    timeout: self.options.open_timeout,
                    why,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn try_open_peer(&self, peer: MemberId, path: &Path) -> Result<Mapping, PeerOpenError> {
        let file =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(path).map_err(
                |e| {
                    if e.raw_os_error() == Some(libc::ELOOP) {
                        PeerOpenError::Untrusted("it is a symbolic link".into())
                    } else {
                        PeerOpenError::NotYet(e.to_string())
                    }
                },
            )?;
        let meta = file.metadata().map_err(|e| PeerOpenError::NotYet(e.to_string()))?;
        check_owned_and_private(&meta).map_err(PeerOpenError::Untrusted)?;
        let m = self.map_peer(peer, file, &meta).map_err(PeerOpenError::NotYet)?;
        Ok(m)
    }

    fn map_peer(&self, peer: MemberId, file: File, meta: &std::fs::Metadata) -> Result<Mapping, String> {
        let want = (HEADER_LEN + self.options.region_len) as u64;
        if meta.len() != want {
            return Err(format!(
                "file is {} bytes, expected {want} (still being created, or another region size)",
                meta.len()
            ));
        }
        let map = MmapOptions::new().map_raw(&file).map_err(|e| e.to_string())?;
        let mapping = Mapping { file, map, inode: meta.ino(), incarnation: 0 };
        if mapping.header_u32(OFF_STATE).load(Ordering::Acquire) != STATE_READY {
            return Err("header not ready".into());
        }
        if mapping.header_u64(OFF_MAGIC) != MAGIC {
            return Err("not an ordo region file (bad magic)".into());
        }
        let version = mapping.header_u32(OFF_VERSION).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(format!("region file version {version}, this build speaks {VERSION}"));
        }
        let member = mapping.header_u32(OFF_MEMBER).load(Ordering::Relaxed);
        if member != peer {
            return Err(format!("file belongs to member {member}"));
        }
        if mapping.header_u64(OFF_REGION_LEN) != self.options.region_len as u64 {
            return Err(format!("region length {} differs from ours", mapping.header_u64(OFF_REGION_LEN)));
        }
        if !mapping.owner_alive() {
            return Err("owner process is not running (stale file)".into());
        }
        let incarnation = mapping.header_u64(OFF_INCARNATION);
        Ok(Mapping { incarnation, ..mapping })
    }

    /// The doorbell a peer parks on, given its mapping.
    fn bell_of(&self, mapping: &Arc<Mapping>) -> Option<Doorbell> {
        let owner = mapping.header_u32(OFF_DOORBELL_OWNER).load(Ordering::Relaxed);
        let holder: Arc<Mapping> = if owner == mapping.header_u32(OFF_MEMBER).load(Ordering::Relaxed) {
            mapping.clone()
        } else if owner == self.options.member {
            // SAFETY: our own header's words, kept alive by `own`.
            return Some(unsafe {
                Doorbell::from_raw(
                    self.own.mapping.doorbell_words(),
                    self.own.clone(),
                    self.own.mapping.inode,
                )
            });
        } else {
            self.links.iter().find(|l| l.id == owner)?.mapping.clone()?
        };
        // SAFETY: the words live in `holder`'s mapping, kept alive by the Arc.
        let key = holder.inode;
        Some(unsafe { Doorbell::from_raw(holder.doorbell_words(), holder, key) })
    }

    /// The options this endpoint was created with.
    pub fn options(&self) -> &ShmOptions {
        &self.options
    }

    /// This member's incarnation number.
    pub fn incarnation(&self) -> u64 {
        self.own.mapping.incarnation
    }

    fn link_index(&self, peer: MemberId) -> Option<usize> {
        self.links.binary_search_by_key(&peer, |l| l.id).ok()
    }

    fn suspect(&mut self, i: usize, cause: FailureCause) {
        let link = &mut self.links[i];
        if !link.suspected {
            link.suspected = true;
            tracing::warn!(member = self.options.member, peer = link.id, %cause, "suspecting peer");
            self.events.push(FabricEvent::Suspected { peer: link.id, cause });
        }
    }

    /// Checks a peer's liveness if its last check is older than the interval.
    fn check_link(&mut self, i: usize, now: Instant) {
        let interval = self.options.liveness_check_interval;
        let link = &mut self.links[i];
        if link.suspected || now.duration_since(link.last_check) < interval {
            return;
        }
        link.last_check = now;
        if !link.mapping.as_ref().is_some_and(|m| m.owner_alive()) {
            self.suspect(i, FailureCause::PeerDead);
        }
    }
}

impl Fabric for ShmFabric {
    fn member(&self) -> MemberId {
        self.options.member
    }

    fn peers(&self) -> &[MemberId] {
        &self.peer_ids
    }

    fn region(&self) -> &Region {
        &self.region
    }

    #[inline]
    fn post_write(&mut self, write: Write) -> Result<(), PostError> {
        let Some(i) = self.link_index(write.peer) else {
            return Err(PostError::UnknownPeer(write.peer));
        };
        check_range(write.offset, write.len, self.options.region_len)?;
        let link = &self.links[i];
        if link.suspected {
            return Err(PostError::PeerSuspected(write.peer));
        }
        if write.signal.is_some() && self.pending.len() >= MAX_PENDING_SIGNALED {
            return Err(PostError::Backpressure(write.peer));
        }
        // SAFETY: both ranges are in bounds (checked) of distinct mappings of
        // region_len bytes; copy_untorn stores word-atomically.
        unsafe {
            copy_untorn(
                link.mapping.as_ref().expect("an unsuspected link is mapped").region_ptr().add(write.offset),
                self.region.as_ptr().add(write.offset) as *const u8,
                write.len,
            );
        }
        // Publish: this write is visible before any later one (a guard).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        if let Some(bell) = &link.bell {
            bell.ring();
        }
        if let Some(tag) = write.signal {
            self.pending.push_back((write.peer, tag));
        }
        Ok(())
    }

    /// One link lookup, the copies in order (each published by a Release
    /// fence, free on x86-TSO), and one doorbell ring — whose SeqCst fence
    /// is what a write costs beyond its copy — for the whole batch.
    #[inline]
    fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
        let Some(i) = self.link_index(peer) else {
            return Err(PartialPost { posted: 0, error: PostError::UnknownPeer(peer) });
        };
        let link = &self.links[i];
        if link.suspected {
            return Err(PartialPost { posted: 0, error: PostError::PeerSuspected(peer) });
        }
        let dst = link.mapping.as_ref().expect("an unsuspected link is mapped").region_ptr();
        let src = self.region.as_ptr() as *const u8;
        let mut result = Ok(());
        for (posted, &(offset, len)) in ranges.iter().enumerate() {
            if let Err(error) = check_range(offset, len, self.options.region_len) {
                result = Err(PartialPost { posted, error });
                break;
            }
            // SAFETY: as in post_write: in-bounds ranges of distinct mappings.
            unsafe { copy_untorn(dst.add(offset), src.add(offset), len) };
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        }
        let posted = result.as_ref().map_or_else(|p| p.posted, |_| ranges.len());
        if posted > 0
            && let Some(bell) = &link.bell
        {
            bell.ring();
        }
        result
    }

    /// `copy_untorn` stores ascending; x86-64 keeps stores in order.
    fn address_ordered(&self) -> bool {
        cfg!(target_arch = "x86_64")
    }

    /// The peer's file mapping: one physical copy of its region, shared.
    fn peer_region(&self, peer: MemberId) -> Option<Region> {
        let link = &self.links[self.link_index(peer)?];
        if link.suspected {
            return None;
        }
        let mapping = link.mapping.as_ref()?.clone();
        let base = std::ptr::NonNull::new(mapping.region_ptr())?;
        // SAFETY: the mapping holds region_len bytes from region_ptr (64-byte
        // aligned: page base + HEADER_LEN) and lives as long as the Arc the
        // region keeps; the peer writes it only with word-atomic stores.
        Some(unsafe { Region::from_raw(base, self.options.region_len, mapping) })
    }

    fn poll_events(&mut self, events: &mut Vec<FabricEvent>) {
        // Reading the clock costs as much as a small write; with nothing to
        // complete, look at it only every 64th call (polls are microseconds
        // apart, so the liveness sweep is late by far less than its interval).
        self.polls_since_sweep += 1;
        if self.pending.is_empty() && self.events.is_empty() && self.polls_since_sweep < 64 {
            return;
        }
        self.polls_since_sweep = 0;
        let now = Instant::now();
        while let Some((peer, tag)) = self.pending.pop_front() {
            let i = self.link_index(peer).expect("pending writes name known peers");
            self.check_link(i, now);
            if self.links[i].suspected {
                self.events.push(FabricEvent::Failed { peer, tag, cause: FailureCause::PeerDead });
            } else {
                self.events.push(FabricEvent::Completed { peer, tag });
            }
        }
        if now.duration_since(self.last_sweep) >= self.options.liveness_check_interval {
            self.last_sweep = now;
            for i in 0..self.links.len() {
                self.check_link(i, now);
            }
        }
        events.append(&mut self.events);
    }

    fn doorbell(&self) -> Option<&Doorbell> {
        Some(&self.doorbell)
    }

    fn is_suspected(&self, peer: MemberId) -> bool {
        self.link_index(peer).is_some_and(|i| self.links[i].suspected)
    }

    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        let i = self.link_index(peer).ok_or(ReconnectError::UnknownPeer(peer))?;
        if !self.links[i].suspected {
            return Ok(self.links[i].mapping.as_ref().expect("an unsuspected link is mapped").incarnation);
        }
        let path = self.options.path_of(peer);
        let mapping = self
            .try_open_peer(peer, &path)
            .map_err(|why| ReconnectError::Unreachable(peer, why.to_string()))?;
        if self.links[i].mapping.as_ref().is_some_and(|m| m.inode == mapping.inode) {
            return Err(ReconnectError::Unreachable(peer, "no new incarnation yet".into()));
        }
        let mapping = Arc::new(mapping);
        let incarnation = mapping.incarnation;
        let bell = self.bell_of(&mapping);
        let link = &mut self.links[i];
        link.mapping = Some(mapping);
        link.bell = bell;
        link.suspected = false;
        link.last_check = Instant::now();
        self.events.push(FabricEvent::Reconnected { peer, incarnation });
        Ok(incarnation)
    }
}

/// Removes region files of `cluster` in `dir` whose owners are dead (left by
/// killed processes). Returns how many were removed.
pub fn remove_stale_files(dir: &Path, cluster: &str) -> std::io::Result<usize> {
    let prefix = format!("ordo-{cluster}-m");
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(&prefix) || !name.ends_with(".region") {
            continue;
        }
        if let Ok(f) = OpenOptions::new().read(true).write(true).open(entry.path())
            && try_lock(&f, libc::LOCK_EX)
        {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
