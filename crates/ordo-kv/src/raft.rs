//! `kv.engine = "raft"`: ordo-kv's state machine under R3P2 — Raft inside
//! R2P2's `REPLICATED_ROUTE` (`ordo-r2p2`'s `RaftReplication`, its durable
//! segment log, sessions for exactly-once application, snapshots) — as the
//! second [`Engine`] beside acuerdo.
//!
//! Each replica runs an R2P2 replicated server on its `kv.raft` address
//! whose handler is [`RaftKv`]: every replica applies the committed batches
//! of [`Entry`]s to the same [`KvState`] the RESP front end reads. The
//! front end's writes reach the log through [`RaftEngine`]: a bridge thread
//! that owns an R2P2 client (leader routing, retries with the same request
//! id, sealed with the client secret) and sends what the front end
//! submitted as one batch at a time.
//!
//! # Invariants
//! - **Order**: one batch in flight at a time, items in submission order,
//!   so entries (and barriers) are logged in the order the front end
//!   submitted them (the front end's per-connection order holds).
//! - **Replies where applied**: an entry's reply is computed by the
//!   replica whose front end took it (`origin`, `nonce`), when it applies
//!   it — as for acuerdo.
//! - **Reads**: a read barrier is a batch item; `ReadReady` is raised by
//!   this replica's handler when it applies the barrier, so the table then
//!   reflects every write committed before the barrier (a read through the
//!   log: linearizable, one Raft round; no read index here).
//! - A batch the handler cannot decode changes nothing (every item is
//!   decoded before any is applied).

use crate::engine::{Engine, EngineEvent, EngineStatus};
use crate::state::{Entry, Reply};
use ordo_fabric::MemberId;
use ordo_r2p2::{Client, ClientConfig, Handler, Policy, RaftStatus, RequestId, Responder, ResponseHandle};
use ordo_runtime::acuerdo::SubmitError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest batch the bridge sends (R2P2 messages are bounded at 1 MiB).
pub const MAX_BATCH_BYTES: usize = 256 << 10;
const ITEM_ENTRY: u8 = 1;
const ITEM_BARRIER: u8 = 2;

/// One item of a batch: an entry, or a read barrier of `origin`'s front end
/// (`nonce`, `ticket`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Entry(Vec<u8>),
    Barrier { origin: u32, nonce: u64, ticket: u64 },
}

fn encode_batch(items: &[(u64, Item)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for (_, item) in items {
        match item {
            Item::Entry(e) => {
                out.push(ITEM_ENTRY);
                out.extend_from_slice(&(e.len() as u32).to_le_bytes());
                out.extend_from_slice(e);
            }
            Item::Barrier { origin, nonce, ticket } => {
                out.push(ITEM_BARRIER);
                out.extend_from_slice(&20u32.to_le_bytes());
                out.extend_from_slice(&origin.to_le_bytes());
                out.extend_from_slice(&nonce.to_le_bytes());
                out.extend_from_slice(&ticket.to_le_bytes());
            }
        }
    }
    out
}

/// A decoded batch item: an entry, or a barrier `(origin, nonce, ticket)`.
pub type Decoded = Result<Entry, (u32, u64, u64)>;

/// What restores the table from a snapshot.
type RestoreFn = Box<dyn Fn(&[u8]) -> Result<(), &'static str> + Send + Sync>;

/// A batch as the raft handler reads it, every item decoded (nothing is
/// applied if any item is bad); bounded by the bytes given (a lying count
/// or length allocates nothing). Public for the fuzz target.
pub fn decode_batch(b: &[u8]) -> Result<Vec<Decoded>, &'static str> {
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, &'static str> {
        if b.len() < n {
            return Err("truncated batch");
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head.to_vec())
    };
    let mut r = b;
    let count = u32::from_le_bytes(take(&mut r, 4)?.try_into().expect("4 bytes")) as usize;
    // Every item takes at least 5 bytes: a lying count allocates nothing.
    if count > r.len() / 5 {
        return Err("batch count beyond its bytes");
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let kind = take(&mut r, 1)?[0];
        let len = u32::from_le_bytes(take(&mut r, 4)?.try_into().expect("4 bytes")) as usize;
        if len > r.len() {
            return Err("item length beyond the batch");
        }
        let body = take(&mut r, len)?;
        out.push(match kind {
            ITEM_ENTRY => Ok(Entry::decode(&body)?),
            ITEM_BARRIER if len == 20 => {
                let w = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
                Err((u32::from_le_bytes(body[..4].try_into().expect("4 bytes")), w(4), w(12)))
            }
            _ => return Err("unknown batch item"),
        });
    }
    if !r.is_empty() {
        return Err("bytes after the batch");
    }
    Ok(out)
}

/// The R2P2 handler: applies committed batches to the table (on every
/// replica), hands this front end's replies and barriers back to it.
pub(crate) struct RaftKv {
    pub(crate) apply: Box<dyn Fn(&Entry) -> Reply + Send + Sync>,
    pub(crate) results: Box<dyn Fn(u64, Reply) + Send + Sync>,
    pub(crate) events: Arc<Mutex<VecDeque<EngineEvent>>>,
    pub(crate) wake: Box<dyn Fn() + Send + Sync>,
    pub(crate) snapshot: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
    pub(crate) restore: RestoreFn,
    pub(crate) me: u32,
    pub(crate) nonce: u64,
}

impl Handler for RaftKv {
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>) {
        if handle.policy() != Policy::ReplicatedRoute {
            // Writes and linearizable reads go through the log only.
            responder.send_response(handle, b"-ERR ordo-kv takes requests through REPLICATED_ROUTE".to_vec());
            return;
        }
        let items = match decode_batch(request) {
            Ok(items) => items,
            Err(why) => {
                // Only ordo-kv front ends holding the client secret submit
                // batches; a bad one is skipped alike everywhere.
                tracing::error!(%why, "a committed batch does not decode; skipped");
                responder.send_response(handle, format!("-ERR {why}").into_bytes());
                return;
            }
        };
        let mut woke = false;
        for item in items {
            match item {
                Ok(entry) => {
                    let reply = (self.apply)(&entry);
                    if entry.origin == self.me && entry.nonce == self.nonce && entry.request != 0 {
                        (self.results)(entry.request, reply);
                        woke = true;
                    }
                }
                Err((origin, nonce, ticket)) => {
                    if origin == self.me && nonce == self.nonce {
                        self.events
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push_back(EngineEvent::ReadReady(ticket));
                        woke = true;
                    }
                }
            }
        }
        if woke {
            (self.wake)();
        }
        responder.send_response(handle, b"+OK".to_vec());
    }

    fn snapshot(&self) -> Option<Vec<u8>> {
        Some((self.snapshot)())
    }

    fn restore(&self, state: &[u8]) -> Result<(), String> {
        (self.restore)(state).map_err(str::to_string)
    }
}

enum Cmd {
    Submit(u64, Item),
    Stop,
}

/// The front end's side of the raft engine.
pub(crate) struct RaftEngine {
    tx: mpsc::Sender<Cmd>,
    events: Arc<Mutex<VecDeque<EngineEvent>>>,
    status: Arc<RaftStatus>,
    /// R2P2 replica index → member id.
    members: Vec<MemberId>,
    me: u32,
    nonce: u64,
    next_ticket: u64,
    max_entry_bytes: usize,
    bridge: Option<std::thread::JoinHandle<()>>,
    closed: Arc<AtomicBool>,
}

impl RaftEngine {
    /// Starts the bridge: an R2P2 client of `servers` (the replicas' raft
    /// addresses, in replica order) sealed with `secret`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        servers: Vec<std::net::SocketAddr>,
        secret: Option<ordo_runtime::Secret>,
        status: Arc<RaftStatus>,
        events: Arc<Mutex<VecDeque<EngineEvent>>>,
        wake: Box<dyn Fn() + Send>,
        members: Vec<MemberId>,
        me: u32,
        nonce: u64,
        max_entry_bytes: usize,
    ) -> std::io::Result<RaftEngine> {
        let mut config = ClientConfig::new(servers);
        config.secret = secret;
        config.timeout = Duration::from_millis(200);
        config.retries = 5;
        config.idle = ordo_runtime::IdleStrategy::BackoffPark {
            spins: 20,
            yields: 5,
            park_min: Duration::from_micros(20),
            park_max: Duration::from_millis(1),
        };
        let client = Client::new(config)?;
        let (tx, rx) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let (ev, cl) = (events.clone(), closed.clone());
        let bridge = std::thread::Builder::new()
            .name(format!("kv-raft-{me}"))
            .spawn(move || bridge(client, rx, ev, wake, cl))?;
        Ok(RaftEngine {
            tx,
            events,
            status,
            members,
            me,
            nonce,
            next_ticket: 1,
            max_entry_bytes,
            bridge: Some(bridge),
            closed,
        })
    }

    fn send(&mut self, item: Item) -> Result<u64, SubmitError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SubmitError::Closed);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tx.send(Cmd::Submit(ticket, item)).map_err(|_| SubmitError::Closed)?;
        Ok(ticket)
    }
}

impl Drop for RaftEngine {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Stop);
        if let Some(b) = self.bridge.take() {
            let _ = b.join();
        }
    }
}

impl Engine for RaftEngine {
    fn submit(&mut self, entry: &[u8]) -> Result<u64, SubmitError> {
        if entry.len() > self.max_entry_bytes {
            return Err(SubmitError::TooLarge { len: entry.len(), max: self.max_entry_bytes });
        }
        self.send(Item::Entry(entry.to_vec()))
    }

    fn read_barrier(&mut self) -> Result<u64, SubmitError> {
        let ticket = self.next_ticket;
        let item = Item::Barrier { origin: self.me, nonce: self.nonce, ticket };
        self.send(item)
    }

    fn poll(&mut self) -> Option<EngineEvent> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    fn leadership(&self) -> (bool, Option<MemberId>) {
        let st = &self.status;
        (st.is_leader(), st.leader().and_then(|i| self.members.get(i).copied()))
    }

    fn status(&self) -> EngineStatus {
        let st = &self.status;
        let role = if st.is_leader() {
            "leader"
        } else if st.leader().is_some() {
            "follower"
        } else {
            "candidate"
        };
        EngineStatus {
            is_leader: st.is_leader(),
            leader: st.leader().and_then(|i| self.members.get(i).copied()),
            role: role.into(),
            term: st.term(),
            epoch: format!("term {}", st.term()),
            committed: format!("index {}", st.commit()),
            delivered: st.applied(),
            elections: 0,
        }
    }
}

/// The bridge thread: batches what the front end submitted, one batch in
/// flight, and settles tickets from the answers.
fn bridge(
    mut client: Client,
    rx: mpsc::Receiver<Cmd>,
    events: Arc<Mutex<VecDeque<EngineEvent>>>,
    wake: Box<dyn Fn() + Send>,
    closed: Arc<AtomicBool>,
) {
    let mut queued: VecDeque<(u64, Item)> = VecDeque::new();
    let mut in_flight: Option<(RequestId, Vec<(u64, Item)>)> = None;
    let settle = |out: Vec<EngineEvent>| {
        if !out.is_empty() {
            events.lock().unwrap_or_else(|e| e.into_inner()).extend(out);
            wake();
        }
    };
    loop {
        // Take what the front end submitted (block briefly when idle).
        let first = if in_flight.is_none() && queued.is_empty() {
            rx.recv_timeout(Duration::from_millis(50)).ok()
        } else {
            rx.try_recv().ok()
        };
        let mut stop = false;
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Cmd::Submit(t, item) => queued.push_back((t, item)),
                Cmd::Stop => stop = true,
            }
        }
        if stop {
            break;
        }
        if in_flight.is_none() && !queued.is_empty() {
            let mut batch = Vec::new();
            let mut bytes = 4;
            while let Some((_, item)) = queued.front() {
                let size = 5 + match item {
                    Item::Entry(e) => e.len(),
                    Item::Barrier { .. } => 20,
                };
                if !batch.is_empty() && bytes + size > MAX_BATCH_BYTES {
                    break;
                }
                bytes += size;
                batch.push(queued.pop_front().expect("checked"));
            }
            match client.send(Policy::ReplicatedRoute, &encode_batch(&batch)) {
                Ok(id) => in_flight = Some((id, batch)),
                Err(e) => {
                    tracing::warn!(%e, "raft batch not sent");
                    settle(batch.iter().map(|(t, item)| refused(*t, item, false)).collect());
                }
            }
        }
        if in_flight.is_some() {
            client.wait(Duration::from_millis(1));
        }
        while let Some((id, result)) = client.try_recv() {
            let Some((sent, batch)) = in_flight.take() else { continue };
            if sent != id {
                in_flight = Some((sent, batch));
                continue;
            }
            let ok = matches!(&result, Ok(b) if b.as_slice() == b"+OK");
            if !ok {
                tracing::warn!(?result, "raft batch failed");
            }
            // Entries: their replies come through the results; barriers:
            // through this replica's handler (ReadReady).
            settle(
                batch
                    .iter()
                    .filter_map(|(t, item)| match (ok, item) {
                        (true, Item::Entry(_)) => Some(EngineEvent::Committed(*t)),
                        (true, Item::Barrier { .. }) => None,
                        (false, item) => Some(refused(*t, item, true)),
                    })
                    .collect(),
            );
        }
    }
    closed.store(true, Ordering::Release);
    let mut out: Vec<EngineEvent> = queued.iter().map(|(t, item)| refused(*t, item, false)).collect();
    if let Some((_, batch)) = in_flight {
        out.extend(batch.iter().map(|(t, item)| refused(*t, item, true)));
    }
    settle(out);
}

/// A ticket whose batch was not sent (`sent` false: certainly not applied)
/// or got no good answer (maybe applied).
fn refused(ticket: u64, item: &Item, sent: bool) -> EngineEvent {
    match (item, sent) {
        (Item::Barrier { .. }, _) => EngineEvent::ReadFailed(ticket),
        (Item::Entry(_), false) => EngineEvent::Lost(ticket),
        (Item::Entry(_), true) => EngineEvent::Unknown(ticket),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Write;

    #[test]
    fn batches_round_trip_and_bad_ones_are_refused_whole() {
        let e = Entry {
            origin: 1,
            nonce: 2,
            request: 3,
            now_ms: 4,
            write: Write::Del { keys: vec![b"k".to_vec()] },
        };
        let items = vec![(1, Item::Entry(e.encode())), (2, Item::Barrier { origin: 1, nonce: 2, ticket: 2 })];
        let b = encode_batch(&items);
        let d = decode_batch(&b).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].as_ref().unwrap(), &e);
        assert_eq!(d[1], Err((1, 2, 2)));
        for cut in 0..b.len() {
            assert!(decode_batch(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut lying = b.clone();
        lying[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_batch(&lying).is_err());
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_batch(&extra).is_err());
    }
}
