//! A replicated key-value service over R2P2: the application the
//! `REPLICATED_ROUTE` tests, the kill -9 test, `ordo r3p2` and the
//! benchmark run. Send its requests with `REPLICATED_ROUTE` and every
//! replica applies them in the same order; reads sent with `LB_ROUTE` are
//! served locally (possibly stale, r3p2 §3.2).
//!
//! # Invariants
//! - [`KvService`] is a deterministic function of the sequence of requests
//!   it applies: same sequence, same state, same answers.
//! - A request that does not decode is answered with [`KvReply::Error`] and
//!   changes nothing.
//! - [`KvService::snapshot`] / [`KvService::restore`] round-trip the whole
//!   state; `restore` validates before it replaces anything.
//! - **One state machine**: the table is ordo-kv's
//!   ([`ordo_kv_core::state::KvState`], the same code `ordo kv serve`
//!   applies under acuerdo or Raft); each [`KvOp`] is applied as the
//!   ordo-kv writes it means (PUT = SET, APPEND, DEL, CAS = a compare then
//!   SET), and its reply (previous value, new value, found value) is read
//!   from the table around the write on the same thread, so it is as
//!   deterministic as the writes.

use crate::server::{Handler, Responder, ResponseHandle};
use ordo_kv_core::state::{Entry, KvState as Table, SetWhen, Ttl, Write};
use std::sync::Mutex;

/// One request to the service (the fields are named in the variants' docs).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// Read `key`.
    Get { key: Vec<u8> },
    /// Set `key` to `value`; answers the previous value.
    Put { key: Vec<u8>, value: Vec<u8> },
    /// Set `key` to `new` if its value is `expected` (`None`: absent);
    /// answers whether it did and the value it found.
    Cas { key: Vec<u8>, expected: Option<Vec<u8>>, new: Vec<u8> },
    /// Append `value` to `key`'s value; answers the new value.
    Append { key: Vec<u8>, value: Vec<u8> },
    /// Remove `key`; answers the previous value.
    Delete { key: Vec<u8> },
}

/// The service's answer.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvReply {
    /// A value (or its absence).
    Value(Option<Vec<u8>>),
    /// The outcome of a compare-and-set and the value found.
    Cas { swapped: bool, found: Option<Vec<u8>> },
    /// The request did not decode.
    Error(String),
}

/// Largest key or value.
pub const MAX_KV_BYTES: usize = 1 << 20;

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt(out: &mut Vec<u8>, b: &Option<Vec<u8>>) {
    match b {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Result<u8, &'static str> {
        let (&b, rest) = self.0.split_first().ok_or("truncated")?;
        self.0 = rest;
        Ok(b)
    }
    fn bytes(&mut self) -> Result<&'a [u8], &'static str> {
        if self.0.len() < 4 {
            return Err("truncated length");
        }
        let n = u32::from_le_bytes(self.0[..4].try_into().unwrap()) as usize;
        if n > MAX_KV_BYTES {
            return Err("key or value too large");
        }
        let rest = &self.0[4..];
        if rest.len() < n {
            return Err("truncated bytes");
        }
        self.0 = &rest[n..];
        Ok(&rest[..n])
    }
    fn opt(&mut self) -> Result<Option<&'a [u8]>, &'static str> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes()?)),
            _ => Err("bad option tag"),
        }
    }
    fn end(&self) -> Result<(), &'static str> {
        if self.0.is_empty() { Ok(()) } else { Err("trailing bytes") }
    }
}

impl KvOp {
    /// The request's wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            KvOp::Get { key } => {
                out.push(1);
                put_bytes(&mut out, key);
            }
            KvOp::Put { key, value } => {
                out.push(2);
                put_bytes(&mut out, key);
                put_bytes(&mut out, value);
            }
            KvOp::Cas { key, expected, new } => {
                out.push(3);
                put_bytes(&mut out, key);
                put_opt(&mut out, expected);
                put_bytes(&mut out, new);
            }
            KvOp::Append { key, value } => {
                out.push(4);
                put_bytes(&mut out, key);
                put_bytes(&mut out, value);
            }
            KvOp::Delete { key } => {
                out.push(5);
                put_bytes(&mut out, key);
            }
        }
        out
    }

    /// Parses a request; every malformed input is an error.
    pub fn decode(b: &[u8]) -> Result<KvOp, &'static str> {
        let mut r = Reader(b);
        let op = match r.u8()? {
            1 => KvOp::Get { key: r.bytes()?.to_vec() },
            2 => KvOp::Put { key: r.bytes()?.to_vec(), value: r.bytes()?.to_vec() },
            3 => KvOp::Cas {
                key: r.bytes()?.to_vec(),
                expected: r.opt()?.map(<[u8]>::to_vec),
                new: r.bytes()?.to_vec(),
            },
            4 => KvOp::Append { key: r.bytes()?.to_vec(), value: r.bytes()?.to_vec() },
            5 => KvOp::Delete { key: r.bytes()?.to_vec() },
            _ => return Err("unknown operation"),
        };
        r.end()?;
        Ok(op)
    }

    /// The key the operation touches.
    pub fn key(&self) -> &[u8] {
        match self {
            KvOp::Get { key }
            | KvOp::Put { key, .. }
            | KvOp::Cas { key, .. }
            | KvOp::Append { key, .. }
            | KvOp::Delete { key } => key,
        }
    }
}

impl KvReply {
    /// The answer's wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            KvReply::Value(v) => {
                out.push(1);
                put_opt(&mut out, v);
            }
            KvReply::Cas { swapped, found } => {
                out.push(2);
                out.push(*swapped as u8);
                put_opt(&mut out, found);
            }
            KvReply::Error(e) => {
                out.push(3);
                put_bytes(&mut out, e.as_bytes());
            }
        }
        out
    }

    /// Parses an answer.
    pub fn decode(b: &[u8]) -> Result<KvReply, &'static str> {
        let mut r = Reader(b);
        let reply = match r.u8()? {
            1 => KvReply::Value(r.opt()?.map(<[u8]>::to_vec)),
            2 => {
                let swapped = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err("bad bool"),
                };
                KvReply::Cas { swapped, found: r.opt()?.map(<[u8]>::to_vec) }
            }
            3 => KvReply::Error(String::from_utf8_lossy(r.bytes()?).into_owned()),
            _ => return Err("unknown reply"),
        };
        r.end()?;
        Ok(reply)
    }
}

/// The key-value state machine of [`KvOp`]s (no I/O; usable without a
/// server): ordo-kv's table, and how many requests were applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvState {
    table: Table,
    applied: u64,
}

const SNAPSHOT_MAGIC: &[u8; 8] = b"ORDOKV2\0";

impl KvState {
    fn write(&mut self, write: Write) {
        // No expiry in this protocol: the stamp is 0 for every replica.
        let _ = self.table.apply(&Entry { origin: 0, nonce: 0, request: 0, now_ms: 0, write });
    }

    fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.table.get(key, 0).map(<[u8]>::to_vec)
    }

    /// Applies one request and answers it.
    pub fn apply(&mut self, request: &[u8]) -> KvReply {
        let op = match KvOp::decode(request) {
            Ok(op) => op,
            Err(e) => return KvReply::Error(e.to_string()),
        };
        self.applied += 1;
        let set = |key, value| Write::Set { key, value, when: SetWhen::Always, get: false, ttl: Ttl::None };
        match op {
            KvOp::Get { key } => KvReply::Value(self.value(&key)),
            KvOp::Put { key, value } => {
                let old = self.value(&key);
                self.write(set(key, value));
                KvReply::Value(old)
            }
            KvOp::Cas { key, expected, new } => {
                let found = self.value(&key);
                let swapped = found == expected;
                if swapped {
                    self.write(set(key, new));
                }
                KvReply::Cas { swapped, found }
            }
            KvOp::Append { key, value } => {
                self.write(Write::Append { key: key.clone(), value });
                KvReply::Value(self.value(&key))
            }
            KvOp::Delete { key } => {
                let old = self.value(&key);
                self.write(Write::Del { keys: vec![key] });
                KvReply::Value(old)
            }
        }
    }

    /// Reads a key without applying anything (local, possibly stale read).
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.table.get(key, 0)
    }

    /// Requests applied (malformed ones excluded).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.table.len(0)
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole state, serialized (the count of requests applied, then
    /// ordo-kv's table snapshot).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = SNAPSHOT_MAGIC.to_vec();
        out.extend_from_slice(&self.applied.to_le_bytes());
        out.extend_from_slice(&self.table.snapshot());
        out
    }

    /// Parses a [`snapshot`](Self::snapshot).
    pub fn from_snapshot(b: &[u8]) -> Result<KvState, &'static str> {
        if b.len() < 16 || &b[..8] != SNAPSHOT_MAGIC {
            return Err("not a kv snapshot");
        }
        let applied = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let mut table = Table::new();
        table.restore(&b[16..])?;
        Ok(KvState { table, applied })
    }
}

/// [`KvState`] as an R2P2 [`Handler`]: `REPLICATED_ROUTE` requests are
/// applied; `FIXED_ROUTE`/`LB_ROUTE` requests may only read (`Get`), served
/// from the local state; writes sent unreplicated are refused.
#[derive(Debug, Default)]
pub struct KvService {
    state: Mutex<KvState>,
}

impl KvService {
    /// An empty store.
    pub fn new() -> KvService {
        KvService::default()
    }

    /// A copy of the current state (tests, monitoring).
    pub fn state(&self) -> KvState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Handler for KvService {
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>) {
        let reply = if handle.policy() == crate::Policy::ReplicatedRoute {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).apply(request)
        } else {
            match KvOp::decode(request) {
                Ok(KvOp::Get { key }) => {
                    let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    KvReply::Value(state.get(&key).map(<[u8]>::to_vec))
                }
                Ok(_) => KvReply::Error("writes need REPLICATED_ROUTE".into()),
                Err(e) => KvReply::Error(e.to_string()),
            }
        };
        responder.send_response(handle, reply.encode());
    }

    fn snapshot(&self) -> Option<Vec<u8>> {
        Some(self.state.lock().unwrap_or_else(|e| e.into_inner()).snapshot())
    }

    fn restore(&self, state: &[u8]) -> Result<(), String> {
        let restored = KvState::from_snapshot(state).map_err(str::to_string)?;
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = restored;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_and_apply() {
        let mut s = KvState::default();
        let ops = [
            KvOp::Put { key: b"a".to_vec(), value: b"1".to_vec() },
            KvOp::Cas { key: b"a".to_vec(), expected: Some(b"1".to_vec()), new: b"2".to_vec() },
            KvOp::Cas { key: b"a".to_vec(), expected: None, new: b"3".to_vec() },
            KvOp::Append { key: b"a".to_vec(), value: b"x".to_vec() },
            KvOp::Get { key: b"a".to_vec() },
            KvOp::Delete { key: b"a".to_vec() },
        ];
        let mut replies = Vec::new();
        for op in &ops {
            assert_eq!(KvOp::decode(&op.encode()).unwrap(), *op);
            let r = s.apply(&op.encode());
            assert_eq!(KvReply::decode(&r.encode()).unwrap(), r);
            replies.push(r);
        }
        assert_eq!(replies[0], KvReply::Value(None));
        assert_eq!(replies[1], KvReply::Cas { swapped: true, found: Some(b"1".to_vec()) });
        assert_eq!(replies[2], KvReply::Cas { swapped: false, found: Some(b"2".to_vec()) });
        assert_eq!(replies[3], KvReply::Value(Some(b"2x".to_vec())));
        assert_eq!(replies[4], KvReply::Value(Some(b"2x".to_vec())));
        assert_eq!(replies[5], KvReply::Value(Some(b"2x".to_vec())));
        assert!(s.is_empty());
        assert_eq!(s.applied(), 6);
    }

    #[test]
    fn malformed_requests_change_nothing() {
        let mut s = KvState::default();
        s.apply(&KvOp::Put { key: b"k".to_vec(), value: b"v".to_vec() }.encode());
        let before = s.clone();
        let good = KvOp::Put { key: b"k".to_vec(), value: b"w".to_vec() }.encode();
        for bad in [vec![], vec![9], good[..good.len() - 1].to_vec(), [good.clone(), vec![0]].concat()] {
            assert!(matches!(s.apply(&bad), KvReply::Error(_)), "{bad:?}");
        }
        // A length claim far beyond the input is refused before allocating.
        let mut huge = vec![2u8];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(s.apply(&huge), KvReply::Error(_)));
        assert_eq!(s, before);
    }

    #[test]
    fn snapshots_round_trip_and_reject_garbage() {
        let mut s = KvState::default();
        for i in 0..100u32 {
            s.apply(&KvOp::Put { key: i.to_le_bytes().to_vec(), value: vec![i as u8; i as usize] }.encode());
        }
        let snap = s.snapshot();
        assert_eq!(KvState::from_snapshot(&snap).unwrap(), s);
        assert!(KvState::from_snapshot(&snap[..snap.len() - 1]).is_err());
        assert!(KvState::from_snapshot(b"garbage").is_err());
        let mut lying = snap.clone();
        lying[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(KvState::from_snapshot(&lying).is_err());
    }
}
