//! The replicated hash table (acuerdo §4.3): the commands that change it,
//! their wire form in the log, and the deterministic state machine every
//! replica applies them to.
//!
//! # Invariants
//! - [`KvState::apply`] is a deterministic function of the sequence of
//!   entries: same entries, same state, same replies. Time enters only
//!   through the stamp the leader's front end put into each entry
//!   ([`Entry::now_ms`]); the state's clock is the largest stamp applied,
//!   so expiry never goes back even when a new leader's clock is behind.
//! - A key whose expiry time is at or before the clock does not exist for
//!   any command; every apply first purges every such key (an index by
//!   expiry time), so expired keys hold no memory after the next write.
//! - A value never exceeds [`MAX_VALUE_BYTES`] (an APPEND that would is
//!   refused and changes nothing); an entry that does not decode changes
//!   nothing.
//! - [`KvState::snapshot`] / [`KvState::restore`] round-trip the whole
//!   state; `restore` validates everything before it replaces anything.

use imbl::{OrdMap, OrdSet};

/// Largest value the state machine keeps (an APPEND beyond it is refused).
pub const MAX_VALUE_BYTES: usize = 64 << 20;

/// A reply to a client, independent of the protocol version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Ok,
    /// A status line (`+PONG`).
    Status(String),
    /// The absent value (`$-1` in RESP2, `_` in RESP3).
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// An error line; the text starts with its code (`ERR ...`).
    Error(String),
    /// An array.
    Array(Vec<Reply>),
    /// A map (RESP3), flattened to an array in RESP2.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// `-ERR text`.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }

    /// A bulk string or nil.
    pub fn opt(v: Option<&[u8]>) -> Reply {
        v.map_or(Reply::Nil, |v| Reply::Bulk(v.to_vec()))
    }
}

/// When a SET applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetWhen {
    /// Always.
    Always,
    /// Only if the key does not exist (NX).
    Nx,
    /// Only if the key exists (XX).
    Xx,
}

/// A SET's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ttl {
    /// No expiry (the key's old one is dropped).
    None,
    /// Expire this many milliseconds after the entry's stamp (EX, PX).
    Ms(u64),
    /// Keep the key's current expiry (KEEPTTL).
    Keep,
}

/// A command that changes the table.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Write {
    /// SET key value [NX|XX] [GET] [EX s|PX ms|KEEPTTL]: `+OK`, nil when
    /// NX/XX did not hold, or with GET the old value.
    Set { key: Vec<u8>, value: Vec<u8>, when: SetWhen, get: bool, ttl: Ttl },
    /// DEL key...: how many existed.
    Del { keys: Vec<Vec<u8>> },
    /// INCRBY key by (INCR, DECR, DECRBY too): the new value.
    IncrBy { key: Vec<u8>, by: i64 },
    /// APPEND key value: the new length.
    Append { key: Vec<u8>, value: Vec<u8> },
    /// MSET key value ...: `+OK`.
    MSet { pairs: Vec<(Vec<u8>, Vec<u8>)> },
    /// GETSET key value: the old value.
    GetSet { key: Vec<u8>, value: Vec<u8> },
    /// CAS key expected new: 1 if the value was `expected` (None: absent)
    /// and is now `new`, else 0.
    Cas { key: Vec<u8>, expected: Option<Vec<u8>>, new: Vec<u8> },
}

/// One log entry: a write, who asked for it, and the leader's clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The replica whose front end took the request (it answers the
    /// client once the entry is applied there).
    pub origin: u32,
    /// That front end's incarnation nonce (a restarted replica does not
    /// answer for entries of its earlier life).
    pub nonce: u64,
    /// The front end's request number (0: nobody waits for the reply).
    pub request: u64,
    /// Wall clock of the submitting leader, Unix milliseconds.
    pub now_ms: u64,
    /// The change.
    pub write: Write,
}

const TAG_SET: u8 = 1;
const TAG_DEL: u8 = 2;
const TAG_INCRBY: u8 = 3;
const TAG_APPEND: u8 = 4;
const TAG_MSET: u8 = 5;
const TAG_GETSET: u8 = 6;
const TAG_CAS: u8 = 7;
const ENTRY_VERSION: u8 = 1;

fn put(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A bounds-checked reader of the wire forms.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("truncated");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn vec(&mut self) -> Result<Vec<u8>, &'static str> {
        self.bytes().map(<[u8]>::to_vec)
    }
    /// A count of items each at least `min` bytes long (bounded by what is left).
    fn count(&mut self, min: usize) -> Result<usize, &'static str> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.0.len() {
            return Err("count exceeds the bytes left");
        }
        Ok(n)
    }
    fn end(&self) -> Result<(), &'static str> {
        if self.0.is_empty() { Ok(()) } else { Err("trailing bytes") }
    }
}

impl Entry {
    /// The entry's wire form (what the log carries).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(ENTRY_VERSION);
        out.extend_from_slice(&self.origin.to_le_bytes());
        out.extend_from_slice(&self.nonce.to_le_bytes());
        out.extend_from_slice(&self.request.to_le_bytes());
        out.extend_from_slice(&self.now_ms.to_le_bytes());
        match &self.write {
            Write::Set { key, value, when, get, ttl } => {
                out.push(TAG_SET);
                put(&mut out, key);
                put(&mut out, value);
                out.push(match when {
                    SetWhen::Always => 0,
                    SetWhen::Nx => 1,
                    SetWhen::Xx => 2,
                });
                out.push(u8::from(*get));
                let (t, ms) = match ttl {
                    Ttl::None => (0, 0),
                    Ttl::Ms(ms) => (1, *ms),
                    Ttl::Keep => (2, 0),
                };
                out.push(t);
                out.extend_from_slice(&ms.to_le_bytes());
            }
            Write::Del { keys } => {
                out.push(TAG_DEL);
                out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
                keys.iter().for_each(|k| put(&mut out, k));
            }
            Write::IncrBy { key, by } => {
                out.push(TAG_INCRBY);
                put(&mut out, key);
                out.extend_from_slice(&by.to_le_bytes());
            }
            Write::Append { key, value } => {
                out.push(TAG_APPEND);
                put(&mut out, key);
                put(&mut out, value);
            }
            Write::MSet { pairs } => {
                out.push(TAG_MSET);
                out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
                for (k, v) in pairs {
                    put(&mut out, k);
                    put(&mut out, v);
                }
            }
            Write::GetSet { key, value } => {
                out.push(TAG_GETSET);
                put(&mut out, key);
                put(&mut out, value);
            }
            Write::Cas { key, expected, new } => {
                out.push(TAG_CAS);
                put(&mut out, key);
                match expected {
                    None => out.push(0),
                    Some(e) => {
                        out.push(1);
                        put(&mut out, e);
                    }
                }
                put(&mut out, new);
            }
        }
        out
    }

    /// Parses [`encode`](Self::encode)'s output; anything else is an error.
    pub fn decode(b: &[u8]) -> Result<Entry, &'static str> {
        let mut r = Reader(b);
        if r.u8()? != ENTRY_VERSION {
            return Err("unknown entry version");
        }
        let (origin, nonce, request, now_ms) = (r.u32()?, r.u64()?, r.u64()?, r.u64()?);
        let write = match r.u8()? {
            TAG_SET => {
                let (key, value) = (r.vec()?, r.vec()?);
                let when = match r.u8()? {
                    0 => SetWhen::Always,
                    1 => SetWhen::Nx,
                    2 => SetWhen::Xx,
                    _ => return Err("bad SET condition"),
                };
                let get = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err("bad SET GET flag"),
                };
                let (t, ms) = (r.u8()?, r.u64()?);
                let ttl = match (t, ms) {
                    (0, 0) => Ttl::None,
                    (1, ms) => Ttl::Ms(ms),
                    (2, 0) => Ttl::Keep,
                    _ => return Err("bad SET expiry"),
                };
                Write::Set { key, value, when, get, ttl }
            }
            TAG_DEL => {
                let n = r.count(4)?;
                Write::Del { keys: (0..n).map(|_| r.vec()).collect::<Result<_, _>>()? }
            }
            TAG_INCRBY => Write::IncrBy { key: r.vec()?, by: r.u64()? as i64 },
            TAG_APPEND => Write::Append { key: r.vec()?, value: r.vec()? },
            TAG_MSET => {
                let n = r.count(8)?;
                Write::MSet {
                    pairs: (0..n)
                        .map(|_| Ok::<_, &'static str>((r.vec()?, r.vec()?)))
                        .collect::<Result<_, _>>()?,
                }
            }
            TAG_GETSET => Write::GetSet { key: r.vec()?, value: r.vec()? },
            TAG_CAS => {
                let key = r.vec()?;
                let expected = match r.u8()? {
                    0 => None,
                    1 => Some(r.vec()?),
                    _ => return Err("bad CAS expectation"),
                };
                Write::Cas { key, expected, new: r.vec()? }
            }
            _ => return Err("unknown write"),
        };
        r.end()?;
        Ok(Entry { origin, nonce, request, now_ms, write })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Item {
    value: Vec<u8>,
    /// Unix ms at which the key expires; 0: never.
    expire_at: u64,
}

/// The table: keys, values, expiry, the clock, and how many entries built
/// it. The maps are persistent (`imbl`): a clone costs O(1) and shares
/// every node until one side writes, so a `disk` replica hands a frozen
/// copy to its snapshot thread without stalling the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvState {
    map: OrdMap<Vec<u8>, Item>,
    /// `(expire_at, key)` of every key with an expiry.
    expiries: OrdSet<(u64, Vec<u8>)>,
    /// The largest entry stamp applied (Unix ms).
    clock_ms: u64,
    applied: u64,
}

/// Parses a RESP integer argument the way Redis does (no spaces, no `+`).
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.starts_with('+') || s.len() > 20 || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

impl KvState {
    /// An empty table.
    pub fn new() -> KvState {
        KvState::default()
    }

    /// Entries applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The state's clock: the largest stamp applied (Unix ms).
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    fn live(&self, key: &[u8], now: u64) -> Option<&Item> {
        self.map.get(key).filter(|i| i.expire_at == 0 || i.expire_at > now)
    }

    /// The value of `key` as of wall clock `now_ms` (never before the
    /// state's clock).
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<&[u8]> {
        self.live(key, now_ms.max(self.clock_ms)).map(|i| i.value.as_slice())
    }

    /// Keys that exist as of `now_ms`.
    pub fn len(&self, now_ms: u64) -> usize {
        let now = now_ms.max(self.clock_ms);
        self.map.len() - self.expiries.range(..(now + 1, Vec::new())).count()
    }

    /// Keys with an expiry (expired ones not yet purged included).
    pub fn expiring(&self) -> usize {
        self.expiries.len()
    }

    /// Up to `count` existing keys after `after` (exclusive) in key order
    /// whose name matches `pattern`, and the last key looked at (the SCAN
    /// cursor's position; None: the end). Looks at no more than
    /// `4 × count` keys per call, so a call is bounded.
    pub fn scan(
        &self,
        after: Option<&[u8]>,
        pattern: Option<&[u8]>,
        count: usize,
        now_ms: u64,
    ) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
        use std::ops::Bound;
        let now = now_ms.max(self.clock_ms);
        let start = after.map_or(Bound::Unbounded, |k| Bound::Excluded(k.to_vec()));
        let mut out = Vec::new();
        let mut last = None;
        let budget = count.max(1).saturating_mul(4);
        for (looked, (k, item)) in self.map.range((start, Bound::Unbounded)).enumerate() {
            if looked >= budget || out.len() >= count.max(1) {
                return (out, last);
            }
            last = Some(k.clone());
            if (item.expire_at == 0 || item.expire_at > now)
                && pattern.is_none_or(|p| crate::glob::matches(p, k))
            {
                out.push(k.clone());
            }
        }
        (out, None)
    }

    fn remove(&mut self, key: &[u8]) -> Option<Item> {
        let item = self.map.remove(key)?;
        if item.expire_at != 0 {
            self.expiries.remove(&(item.expire_at, key.to_vec()));
        }
        Some(item)
    }

    fn insert(&mut self, key: Vec<u8>, item: Item) {
        if let Some(old) = self.map.get(&key)
            && old.expire_at != 0
        {
            self.expiries.remove(&(old.expire_at, key.clone()));
        }
        if item.expire_at != 0 {
            self.expiries.insert((item.expire_at, key.clone()));
        }
        self.map.insert(key, item);
    }

    fn purge_expired(&mut self) {
        while let Some((at, _)) = self.expiries.get_min()
            && *at <= self.clock_ms
        {
            let (_, key) = self.expiries.remove_min().expect("just seen");
            self.map.remove(&key);
        }
    }

    /// Applies one entry and returns the reply for its client.
    pub fn apply(&mut self, entry: &Entry) -> Reply {
        self.applied += 1;
        self.clock_ms = self.clock_ms.max(entry.now_ms);
        self.purge_expired();
        let now = self.clock_ms;
        let reply = match &entry.write {
            Write::Set { key, value, when, get, ttl } => {
                let old = self.map.get(key).cloned();
                let holds = match when {
                    SetWhen::Always => true,
                    SetWhen::Nx => old.is_none(),
                    SetWhen::Xx => old.is_some(),
                };
                if holds {
                    let expire_at = match ttl {
                        Ttl::None => 0,
                        Ttl::Ms(ms) => now.saturating_add(*ms).max(1),
                        Ttl::Keep => old.as_ref().map_or(0, |o| o.expire_at),
                    };
                    self.insert(key.clone(), Item { value: value.clone(), expire_at });
                }
                match (get, holds) {
                    (true, _) => Reply::opt(old.as_ref().map(|o| o.value.as_slice())),
                    (false, true) => Reply::Ok,
                    (false, false) => Reply::Nil,
                }
            }
            Write::Del { keys } => {
                Reply::Int(keys.iter().filter(|k| self.remove(k).is_some()).count() as i64)
            }
            Write::IncrBy { key, by } => {
                let old = self.map.get(key);
                let current = match old {
                    None => Some(0),
                    Some(i) => parse_i64(&i.value),
                };
                match current {
                    None => Reply::err("value is not an integer or out of range"),
                    Some(c) => match c.checked_add(*by) {
                        None => Reply::err("increment or decrement would overflow"),
                        Some(n) => {
                            let expire_at = old.map_or(0, |i| i.expire_at);
                            self.insert(key.clone(), Item { value: n.to_string().into_bytes(), expire_at });
                            Reply::Int(n)
                        }
                    },
                }
            }
            Write::Append { key, value } => {
                let len = self.map.get(key).map_or(0, |i| i.value.len());
                if len + value.len() > MAX_VALUE_BYTES {
                    Reply::err("string exceeds maximum allowed size")
                } else if let Some(i) = self.map.get_mut(key) {
                    i.value.extend_from_slice(value);
                    Reply::Int(i.value.len() as i64)
                } else {
                    self.insert(key.clone(), Item { value: value.clone(), expire_at: 0 });
                    Reply::Int(value.len() as i64)
                }
            }
            Write::MSet { pairs } => {
                for (k, v) in pairs {
                    self.insert(k.clone(), Item { value: v.clone(), expire_at: 0 });
                }
                Reply::Ok
            }
            Write::GetSet { key, value } => {
                let old = self.remove(key);
                self.insert(key.clone(), Item { value: value.clone(), expire_at: 0 });
                Reply::opt(old.as_ref().map(|o| o.value.as_slice()))
            }
            Write::Cas { key, expected, new } => {
                let found = self.map.get(key).map(|i| i.value.as_slice());
                if found == expected.as_deref() {
                    let expire_at = self.map.get(key).map_or(0, |i| i.expire_at);
                    self.insert(key.clone(), Item { value: new.clone(), expire_at });
                    Reply::Int(1)
                } else {
                    Reply::Int(0)
                }
            }
        };
        debug_assert_eq!(
            self.expiries.len(),
            self.map.values().filter(|i| i.expire_at != 0).count(),
            "the expiry index covers exactly the keys with an expiry"
        );
        reply
    }

    /// The whole state, serialized (state transfer, snapshots).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = b"ORDOKVS1".to_vec();
        out.extend_from_slice(&self.applied.to_le_bytes());
        out.extend_from_slice(&self.clock_ms.to_le_bytes());
        out.extend_from_slice(&(self.map.len() as u32).to_le_bytes());
        for (k, i) in &self.map {
            put(&mut out, k);
            put(&mut out, &i.value);
            out.extend_from_slice(&i.expire_at.to_le_bytes());
        }
        out
    }

    /// Replaces the state by a [`snapshot`](Self::snapshot); a malformed
    /// one is refused and changes nothing.
    pub fn restore(&mut self, b: &[u8]) -> Result<(), &'static str> {
        let mut r = Reader(b);
        if r.take(8)? != b"ORDOKVS1" {
            return Err("not a kv snapshot");
        }
        let (applied, clock_ms) = (r.u64()?, r.u64()?);
        let n = r.count(16)?;
        let mut s = KvState { applied, clock_ms, ..KvState::default() };
        let mut prev: Option<Vec<u8>> = None;
        for _ in 0..n {
            let key = r.vec()?;
            if prev.as_ref().is_some_and(|p| *p >= key) {
                return Err("keys out of order");
            }
            let value = r.vec()?;
            if value.len() > MAX_VALUE_BYTES {
                return Err("value too large");
            }
            let expire_at = r.u64()?;
            prev = Some(key.clone());
            s.insert(key, Item { value, expire_at });
        }
        r.end()?;
        *self = s;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(now_ms: u64, write: Write) -> Entry {
        Entry { origin: 1, nonce: 7, request: 3, now_ms, write }
    }

    fn set(k: &str, v: &str) -> Write {
        Write::Set { key: k.into(), value: v.into(), when: SetWhen::Always, get: false, ttl: Ttl::None }
    }

    #[test]
    fn commands_answer_like_redis() {
        let mut s = KvState::new();
        assert_eq!(s.apply(&entry(1, set("a", "1"))), Reply::Ok);
        let nx =
            Write::Set { key: "a".into(), value: "2".into(), when: SetWhen::Nx, get: false, ttl: Ttl::None };
        assert_eq!(s.apply(&entry(1, nx)), Reply::Nil);
        let xx_get =
            Write::Set { key: "a".into(), value: "3".into(), when: SetWhen::Xx, get: true, ttl: Ttl::None };
        assert_eq!(s.apply(&entry(1, xx_get)), Reply::Bulk(b"1".to_vec()));
        assert_eq!(s.apply(&entry(1, Write::IncrBy { key: "a".into(), by: 4 })), Reply::Int(7));
        assert_eq!(s.apply(&entry(1, Write::IncrBy { key: "n".into(), by: -2 })), Reply::Int(-2));
        assert_eq!(s.apply(&entry(1, Write::Append { key: "a".into(), value: "x".into() })), Reply::Int(2));
        assert!(
            matches!(s.apply(&entry(1, Write::IncrBy { key: "a".into(), by: 1 })), Reply::Error(e) if e.starts_with("ERR value is not an integer"))
        );
        s.apply(&entry(1, set("big", &i64::MAX.to_string())));
        assert!(
            matches!(s.apply(&entry(1, Write::IncrBy { key: "big".into(), by: 1 })), Reply::Error(e) if e.contains("overflow"))
        );
        assert_eq!(
            s.apply(&entry(1, Write::GetSet { key: "a".into(), value: "g".into() })),
            Reply::Bulk(b"7x".to_vec())
        );
        let cas = |e: Option<&str>, n: &str| Write::Cas {
            key: "a".into(),
            expected: e.map(|e| e.as_bytes().to_vec()),
            new: n.into(),
        };
        assert_eq!(s.apply(&entry(1, cas(Some("nope"), "z"))), Reply::Int(0));
        assert_eq!(s.apply(&entry(1, cas(Some("g"), "z"))), Reply::Int(1));
        assert_eq!(s.apply(&entry(1, cas(None, "q"))), Reply::Int(0));
        assert_eq!(s.get(b"a", 0), Some(&b"z"[..]));
        assert_eq!(
            s.apply(&entry(1, Write::Del { keys: vec!["a".into(), "zz".into(), "n".into()] })),
            Reply::Int(2)
        );
        assert_eq!(s.len(0), 1);
    }

    #[test]
    fn expiry_follows_the_stamped_clock_and_never_goes_back() {
        let mut s = KvState::new();
        let px = Write::Set {
            key: "t".into(),
            value: "v".into(),
            when: SetWhen::Always,
            get: false,
            ttl: Ttl::Ms(100),
        };
        s.apply(&entry(1_000, px));
        assert_eq!(s.get(b"t", 1_050), Some(&b"v"[..]));
        assert_eq!(s.get(b"t", 1_100), None, "expired at its time for a reader");
        assert_eq!(s.len(1_100), 0);
        // A new leader whose clock is behind cannot resurrect it.
        s.apply(&entry(1_200, set("other", "x")));
        s.apply(&entry(900, set("late", "y")));
        assert_eq!(s.clock_ms(), 1_200);
        assert_eq!(s.get(b"t", 0), None);
        assert_eq!(s.expiring(), 0, "purged at the next write");
        // KEEPTTL and INCR keep an expiry; SET drops it.
        let px = Write::Set {
            key: "k".into(),
            value: "1".into(),
            when: SetWhen::Always,
            get: false,
            ttl: Ttl::Ms(50),
        };
        s.apply(&entry(1_200, px));
        s.apply(&entry(1_210, Write::IncrBy { key: "k".into(), by: 1 }));
        let keep = Write::Set {
            key: "k".into(),
            value: "5".into(),
            when: SetWhen::Always,
            get: false,
            ttl: Ttl::Keep,
        };
        s.apply(&entry(1_220, keep));
        assert_eq!(s.get(b"k", 1_249), Some(&b"5"[..]));
        assert_eq!(s.get(b"k", 1_250), None);
    }

    #[test]
    fn scan_visits_every_key_once_in_bounded_steps() {
        let mut s = KvState::new();
        for i in 0..100 {
            s.apply(&entry(1, set(&format!("key:{i:03}"), "v")));
        }
        s.apply(&entry(1, set("other", "v")));
        let (mut seen, mut cursor) = (Vec::new(), None::<Vec<u8>>);
        loop {
            let (keys, next) = s.scan(cursor.as_deref(), Some(b"key:*"), 7, 0);
            assert!(keys.len() <= 7);
            seen.extend(keys);
            match next {
                None => break,
                Some(c) => cursor = Some(c),
            }
        }
        assert_eq!(seen.len(), 100);
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_bad_snapshot_changes_nothing() {
        let mut s = KvState::new();
        s.apply(&entry(5, set("a", "1")));
        let good = s.snapshot();
        for bad in [&good[..good.len() - 1], b"nope", &[good.as_slice(), b"x"].concat()] {
            let before = s.clone();
            assert!(s.restore(bad).is_err());
            assert_eq!(s, before);
        }
    }

    fn write_strategy() -> impl Strategy<Value = Write> {
        let key = prop::sample::select(vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        let val = prop::collection::vec(any::<u8>(), 0..8);
        prop_oneof![
            (key.clone(), val.clone(), 0..3u8, any::<bool>(), 0..3u8, 0..50u64).prop_map(
                |(key, value, w, get, t, ms)| {
                    Write::Set {
                        key,
                        value,
                        when: [SetWhen::Always, SetWhen::Nx, SetWhen::Xx][w as usize],
                        get,
                        ttl: [Ttl::None, Ttl::Ms(ms), Ttl::Keep][t as usize],
                    }
                }
            ),
            prop::collection::vec(key.clone(), 0..3).prop_map(|keys| Write::Del { keys }),
            (key.clone(), -5..5i64).prop_map(|(key, by)| Write::IncrBy { key, by }),
            (key.clone(), val.clone()).prop_map(|(key, value)| Write::Append { key, value }),
            prop::collection::vec((key.clone(), val.clone()), 0..3).prop_map(|pairs| Write::MSet { pairs }),
            (key.clone(), val.clone()).prop_map(|(key, value)| Write::GetSet { key, value }),
            (key, prop::option::of(val.clone()), val).prop_map(|(key, expected, new)| Write::Cas {
                key,
                expected,
                new
            }),
        ]
    }

    proptest! {
        /// Entries round-trip; replicas applying the same entries agree;
        /// a snapshot taken anywhere restores to the same state.
        #[test]
        fn deterministic_and_round_trips(writes in prop::collection::vec((write_strategy(), 0..100u64), 1..40)) {
            let (mut a, mut b) = (KvState::new(), KvState::new());
            for (i, (w, now)) in writes.iter().enumerate() {
                let e = Entry { origin: 2, nonce: 9, request: i as u64, now_ms: *now, write: w.clone() };
                let bytes = e.encode();
                let decoded = Entry::decode(&bytes);
                prop_assert_eq!(decoded.as_ref(), Ok(&e));
                for cut in [0, bytes.len() / 2, bytes.len() - 1] {
                    prop_assert!(Entry::decode(&bytes[..cut]).is_err());
                }
                let ra = a.apply(&e);
                let rb = b.apply(&Entry::decode(&bytes).unwrap());
                prop_assert_eq!(ra, rb);
                let mut c = KvState::new();
                c.restore(&a.snapshot()).unwrap();
                prop_assert_eq!(&c, &a);
            }
            prop_assert_eq!(a, b);
        }
    }
}
