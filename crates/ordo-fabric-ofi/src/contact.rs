//! The set-up path: how members learn each other's libfabric address,
//! memory key and region base, authenticated with the cluster secret, and
//! how a member learns that a peer's process is gone.
//!
//! Every member runs a *contact* listener (a TCP port). To reach peer `p`,
//! a member dials `p`'s contact address and runs the mutual
//! challenge-response of [`ordo_auth::handshake`]; only after both proofs
//! verify does `p` send its [`Card`] (provider address, key, base, region
//! length, incarnation), MACed over both hellos. The connection then stays
//! open and carries nothing: its end (EOF or reset) is how the dialer
//! learns that `p`'s process died — the liveness signal the shm backend
//! takes from a file lock.
//!
//! ```text
//! dialer                                   acceptor (the peer)
//!   HELLO_d (id, wanted id, cluster, nonce) ──▶
//!                                      ◀──  HELLO_a, PROOF_a
//!   PROOF_d                               ──▶  verifies; only now:
//!                                      ◀──  CARD_a, HMAC(K, "card" ‖ HELLO_d ‖ HELLO_a ‖ CARD_a)
//! K = Secret::derive("ordo ofi set-up v1")
//! ```
//!
//! # Invariants
//! - The card — whose key is the capability to write into the member's
//!   region — goes only to a dialer that proved the secret.
//! - Every read has a deadline (`handshake_timeout`); at most
//!   [`MAX_HANDSHAKES`] handshakes run at once, more are closed at once.
//! - Every field of a card is checked before use (magic, version, member,
//!   region length, address length ≤ [`MAX_NAME`]); a bad one is an error
//!   naming it, and nothing is changed.

use ordo_auth::Key;
use ordo_auth::handshake::{self, NONCE_LEN, PROOF_LEN, Role};
use ordo_fabric::MemberId;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest provider address a card may carry.
pub const MAX_NAME: usize = 256;
/// Most handshakes a contact listener runs at once.
pub const MAX_HANDSHAKES: usize = 16;
const VERSION: u16 = 1;
const HELLO_LEN: usize = 4 + 2 + 2 + 4 + 4 + 8 + NONCE_LEN;
const CARD_LEN: usize = 4 + 2 + 2 + 4 + 4 + 8 * 4 + MAX_NAME;
/// The label the set-up key is derived under.
pub const KEY_LABEL: &str = "ordo ofi set-up v1";

/// What a member tells an authenticated peer about its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Card {
    /// The member.
    pub member: MemberId,
    /// Its incarnation (fresh random per process start).
    pub incarnation: u64,
    /// Its region's length.
    pub region_len: u64,
    /// Its region's base address (remote addresses are base + offset where
    /// the provider uses virtual addresses).
    pub base: u64,
    /// Its memory registration's key.
    pub key: u64,
    /// Its libfabric endpoint address (`fi_getname`).
    pub name: Vec<u8>,
}

impl Card {
    fn encode(&self) -> [u8; CARD_LEN] {
        assert!(self.name.len() <= MAX_NAME, "provider address longer than {MAX_NAME} bytes");
        let mut b = [0u8; CARD_LEN];
        b[0..4].copy_from_slice(b"OFIC");
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.name.len() as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.member.to_le_bytes());
        b[16..24].copy_from_slice(&self.incarnation.to_le_bytes());
        b[24..32].copy_from_slice(&self.region_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.base.to_le_bytes());
        b[40..48].copy_from_slice(&self.key.to_le_bytes());
        b[48..48 + self.name.len()].copy_from_slice(&self.name);
        b
    }

    fn decode(b: &[u8; CARD_LEN]) -> Result<Card, ContactError> {
        if &b[0..4] != b"OFIC" {
            return Err(ContactError::Protocol("card has a bad magic".into()));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(ContactError::Protocol(format!("card version {version}, expected {VERSION}")));
        }
        let name_len = u16::from_le_bytes([b[6], b[7]]) as usize;
        if name_len == 0 || name_len > MAX_NAME {
            return Err(ContactError::Protocol(format!(
                "card's address length {name_len} is not in 1..={MAX_NAME}"
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Card {
            member: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            incarnation: u64_at(16),
            region_len: u64_at(24),
            base: u64_at(32),
            key: u64_at(40),
            name: b[48..48 + name_len].to_vec(),
        })
    }
}

/// Why reaching a peer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContactError {
    /// The peer's contact address could not be reached (yet), or the
    /// connection broke before the handshake ended (a listener closing,
    /// as an old view's does while the new one opens): worth a retry.
    #[error("cannot reach {0}: {1}")]
    Unreachable(SocketAddr, String),
    /// The peer did not prove the cluster secret, or we were refused.
    #[error("handshake with {0} failed: {1}")]
    Refused(SocketAddr, String),
    /// The peer sent something that is not this protocol.
    #[error("malformed set-up message: {0}")]
    Protocol(String),
}

fn hello(me: MemberId, want: MemberId, cluster: u64, nonce: &[u8; NONCE_LEN]) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..4].copy_from_slice(b"OFIH");
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[8..12].copy_from_slice(&me.to_le_bytes());
    b[12..16].copy_from_slice(&want.to_le_bytes());
    b[16..24].copy_from_slice(&cluster.to_le_bytes());
    b[24..].copy_from_slice(nonce);
    b
}

/// (sender, wanted, cluster) of a hello, checked for magic and version.
fn parse_hello(b: &[u8; HELLO_LEN]) -> Result<(MemberId, MemberId, u64), String> {
    if &b[0..4] != b"OFIH" || u16::from_le_bytes([b[4], b[5]]) != VERSION {
        return Err("not an ordo ofi set-up hello (magic or version)".into());
    }
    Ok((
        u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
        u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
        u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
    ))
}

/// FNV-1a of the cluster name (groups on one network do not mix).
pub fn cluster_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Dials `addr`, proves the secret, and returns the peer's card and the
/// open connection (whose end signals the peer's death).
pub fn fetch_card(
    addr: SocketAddr,
    me: MemberId,
    want: MemberId,
    cluster: u64,
    key: &Key,
    timeout: Duration,
) -> Result<(Card, TcpStream), ContactError> {
    let unreachable = |e: std::io::Error| ContactError::Unreachable(addr, e.to_string());
    let refused = |why: String| ContactError::Refused(addr, why);
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(unreachable)?;
    s.set_nodelay(true).map_err(unreachable)?;
    s.set_read_timeout(Some(timeout)).map_err(unreachable)?;
    s.set_write_timeout(Some(timeout)).map_err(unreachable)?;
    let h_d = hello(me, want, cluster, &handshake::nonce());
    s.write_all(&h_d).map_err(unreachable)?;
    let mut h_a = [0u8; HELLO_LEN];
    let mut p_a = [0u8; PROOF_LEN];
    s.read_exact(&mut h_a).map_err(|e| ContactError::Unreachable(addr, format!("no hello: {e}")))?;
    s.read_exact(&mut p_a).map_err(|e| ContactError::Unreachable(addr, format!("no proof: {e}")))?;
    let (id, _, their_cluster) = parse_hello(&h_a).map_err(refused)?;
    if id != want {
        return Err(refused(format!("member {id} answered where member {want} was expected")));
    }
    if their_cluster != cluster {
        return Err(refused("a member of another cluster answered".into()));
    }
    if !handshake::verify(key, Role::Acceptor, &h_d, &h_a, &p_a) {
        return Err(refused("the peer did not prove the cluster secret".into()));
    }
    s.write_all(&handshake::proof(key, Role::Dialer, &h_d, &h_a)).map_err(unreachable)?;
    let mut card = [0u8; CARD_LEN];
    let mut tag = [0u8; 32];
    // A peer that refused our proof closes the connection here too; it
    // logged why. Ours was valid if we hold the secret, so a broken
    // connection here is retried like an unreachable peer.
    s.read_exact(&mut card).map_err(|e| ContactError::Unreachable(addr, format!("no card: {e}")))?;
    s.read_exact(&mut tag).map_err(|e| ContactError::Unreachable(addr, format!("no card tag: {e}")))?;
    if !key.verify(&[b"ordo ofi card", &h_d, &h_a, &card], &tag) {
        return Err(refused("the card's MAC does not verify".into()));
    }
    let card = Card::decode(&card)?;
    if card.member != want {
        return Err(ContactError::Protocol(format!("card of member {} from member {want}", card.member)));
    }
    s.set_nonblocking(true).map_err(unreachable)?;
    Ok((card, s))
}

/// Whether a liveness connection is still open (`false` once the peer's
/// process closed it or died). Never blocks.
pub fn still_open(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => false,
        Ok(_) => true, // the peer never sends; ignore
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => true,
        Err(_) => false,
    }
}

/// A member's contact listener: answers authenticated peers with its card
/// and holds their connections open until it is dropped.
pub struct Contact {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Contact {
    /// Listens on `listen` (port 0: any) and answers with `card`.
    pub fn start(
        listen: SocketAddr,
        card: Card,
        cluster: u64,
        key: Key,
        timeout: Duration,
    ) -> std::io::Result<Contact> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let card = Arc::new(card.encode());
        let thread = std::thread::Builder::new()
            .name(format!("ofi-contact-{}", card_member(&card)))
            .spawn(move || serve(listener, card, cluster, key, timeout, st))?;
        Ok(Contact { addr, stop, thread: Some(thread) })
    }

    /// The address peers dial.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

fn card_member(card: &[u8; CARD_LEN]) -> MemberId {
    u32::from_le_bytes(card[8..12].try_into().expect("4 bytes"))
}

impl Drop for Contact {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    listener: TcpListener,
    card: Arc<[u8; CARD_LEN]>,
    cluster: u64,
    key: Key,
    timeout: Duration,
    stop: Arc<AtomicBool>,
) {
    let me = card_member(&card);
    let running = Arc::new(AtomicUsize::new(0));
    // Connections of peers that got the card: kept open (they carry our
    // liveness) until we stop; closed ones are pruned.
    let held: Arc<std::sync::Mutex<Vec<TcpStream>>> = Arc::default();
    let mut workers = Vec::new();
    let mut logged_refusal = false;
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, from)) => {
                if running.load(Ordering::Acquire) >= MAX_HANDSHAKES {
                    tracing::warn!(%from, "ofi contact: too many handshakes in progress; closing");
                    continue;
                }
                running.fetch_add(1, Ordering::AcqRel);
                let (card, key, running, held) = (card.clone(), key.clone(), running.clone(), held.clone());
                let refusal_logged = logged_refusal;
                logged_refusal = true;
                workers.push(std::thread::spawn(move || {
                    match answer(s, me, &card, cluster, &key, timeout) {
                        Ok(s) => held.lock().expect("held lock").push(s),
                        Err(why) if !refusal_logged => tracing::error!(%from, %why, "ofi contact: refused"),
                        Err(why) => tracing::debug!(%from, %why, "ofi contact: refused"),
                    }
                    running.fetch_sub(1, Ordering::AcqRel);
                }));
                workers.retain(|w| !w.is_finished());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                held.lock().expect("held lock").retain_mut(still_open);
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => {
                tracing::warn!(%e, "ofi contact: accept failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    // Handshakes in progress end within their timeout.
    let deadline = Instant::now() + timeout;
    for w in workers {
        while !w.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    held.lock().expect("held lock").clear();
}

fn answer(
    mut s: TcpStream,
    me: MemberId,
    card: &[u8; CARD_LEN],
    cluster: u64,
    key: &Key,
    timeout: Duration,
) -> Result<TcpStream, String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let mut h_d = [0u8; HELLO_LEN];
    s.read_exact(&mut h_d).map_err(|e| format!("no hello: {e}"))?;
    let (from, want, their_cluster) = parse_hello(&h_d)?;
    if want != me {
        return Err(format!("member {from} wanted member {want}, this is member {me}"));
    }
    if their_cluster != cluster {
        return Err(format!("member {from} belongs to another cluster"));
    }
    let h_a = hello(me, from, cluster, &handshake::nonce());
    s.write_all(&h_a).map_err(|e| e.to_string())?;
    s.write_all(&handshake::proof(key, Role::Acceptor, &h_d, &h_a)).map_err(|e| e.to_string())?;
    let mut p_d = [0u8; PROOF_LEN];
    s.read_exact(&mut p_d).map_err(|e| format!("no proof: {e}"))?;
    if !handshake::verify(key, Role::Dialer, &h_d, &h_a, &p_d) {
        return Err(format!("member {from} did not prove the cluster secret"));
    }
    s.write_all(card.as_slice()).map_err(|e| e.to_string())?;
    s.write_all(&key.tag(&[b"ordo ofi card", &h_d, &h_a, card.as_slice()])).map_err(|e| e.to_string())?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(member: MemberId) -> Card {
        Card { member, incarnation: 9, region_len: 4096, base: 0x1000, key: 77, name: vec![1, 2, 3] }
    }

    #[test]
    fn a_card_round_trips_and_bad_fields_are_errors() {
        let c = card(4);
        assert_eq!(Card::decode(&c.encode()).unwrap(), c);
        let mut b = c.encode();
        b[0] = b'X';
        assert!(matches!(Card::decode(&b), Err(ContactError::Protocol(_))));
        let mut b = c.encode();
        b[6..8].copy_from_slice(&(MAX_NAME as u16 + 1).to_le_bytes());
        assert!(matches!(Card::decode(&b), Err(ContactError::Protocol(_))));
    }

    #[test]
    fn only_a_holder_of_the_secret_gets_the_card() {
        let secret = ordo_auth::Secret::generate();
        let key = secret.derive(KEY_LABEL);
        let t = Duration::from_secs(5);
        let contact = Contact::start("127.0.0.1:0".parse().unwrap(), card(1), 7, key.clone(), t).unwrap();
        let (got, mut s) = fetch_card(contact.local_addr(), 0, 1, 7, &key, t).unwrap();
        assert_eq!(got, card(1));
        assert!(still_open(&mut s));
        // A stranger with another secret is refused and learns no card.
        let stranger = ordo_auth::Secret::generate().derive(KEY_LABEL);
        assert!(matches!(
            fetch_card(contact.local_addr(), 0, 1, 7, &stranger, t),
            Err(ContactError::Refused(..))
        ));
        // Asking for the wrong member, or from another cluster, is refused.
        assert!(fetch_card(contact.local_addr(), 0, 2, 7, &key, t).is_err());
        assert!(fetch_card(contact.local_addr(), 0, 1, 8, &key, t).is_err());
        // A dialer that sends garbage gets nothing and the listener lives on.
        let mut g = TcpStream::connect(contact.local_addr()).unwrap();
        g.write_all(&[0xFF; HELLO_LEN]).unwrap();
        let mut buf = [0u8; 1];
        g.set_read_timeout(Some(t)).unwrap();
        assert!(matches!(g.read(&mut buf), Ok(0) | Err(_)), "garbage got an answer");
        assert!(fetch_card(contact.local_addr(), 0, 1, 7, &key, t).is_ok());
        // The liveness connection ends when the member does.
        drop(contact);
        let start = Instant::now();
        while still_open(&mut s) {
            assert!(start.elapsed() < t, "the connection outlived the contact");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
