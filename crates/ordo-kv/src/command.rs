//! Redis commands: parsing a request's arguments into what the server
//! does with it — a write to replicate, a read to answer after a read
//! barrier (or locally), or a connection command — and answering reads
//! from a [`KvState`].
//!
//! Parsing never changes state: a bad request becomes the Redis-style
//! error it would get from Redis (`-ERR wrong number of arguments for
//! 'get' command`, `-ERR syntax error`, `-ERR unknown command 'FOO'`...).

use crate::state::{KvState, Reply, SetWhen, Ttl, Write, parse_i64};

/// Bounds on keys and values (configuration `kv.max_key_bytes`,
/// `kv.max_value_bytes`).
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Longest key.
    pub max_key_bytes: usize,
    /// Longest value.
    pub max_value_bytes: usize,
}

/// A read.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    Get { key: Vec<u8> },
    MGet { keys: Vec<Vec<u8>> },
    Exists { keys: Vec<Vec<u8>> },
    StrLen { key: Vec<u8> },
    DbSize,
    Keys { pattern: Vec<u8> },
    Scan { cursor: u64, pattern: Option<Vec<u8>>, count: usize },
}

/// What the server does with one request (fields named as in the commands).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Answer at once (PING, ECHO, SELECT 0, COMMAND, errors).
    Reply(Reply),
    /// Replicate, then answer with the state machine's reply.
    Write(Write),
    /// Answer from the state once it is linearizable (or at once on a
    /// READONLY connection).
    Read(Read),
    /// AUTH [user] password.
    Auth { user: Option<Vec<u8>>, password: Vec<u8> },
    /// HELLO [protover [AUTH user pass] [SETNAME name]].
    Hello { proto: Option<u8>, auth: Option<(Vec<u8>, Vec<u8>)>, name: Option<Vec<u8>> },
    /// CLIENT SETNAME name.
    SetName(Vec<u8>),
    /// CLIENT GETNAME.
    GetName,
    /// CLIENT ID.
    ClientId,
    /// INFO [section].
    Info,
    /// READONLY: this connection reads the local replica (may be stale).
    ReadOnly,
    /// READWRITE: back to linearizable reads.
    ReadWrite,
    /// QUIT.
    Quit,
    /// `ORDO FORWARDED`: this connection carries a follower's forwarded
    /// requests (they are never forwarded again).
    Forwarded,
}

fn arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{}' command", name.to_ascii_lowercase()))
}

fn syntax() -> Reply {
    Reply::err("syntax error")
}

fn not_int() -> Reply {
    Reply::err("value is not an integer or out of range")
}

/// Parses one request.
pub fn parse(args: &[Vec<u8>], sizes: &Sizes) -> Action {
    let Some(first) = args.first() else {
        return Action::Reply(Reply::err("empty command"));
    };
    let name = String::from_utf8_lossy(first).to_ascii_uppercase();
    let rest = &args[1..];
    let n = rest.len();
    let key_ok = |k: &Vec<u8>| k.len() <= sizes.max_key_bytes;
    let val_ok = |v: &Vec<u8>| v.len() <= sizes.max_value_bytes;
    let too_big = || {
        Reply::err(format!(
            "key or value too large (limits: kv.max_key_bytes {}, kv.max_value_bytes {})",
            sizes.max_key_bytes, sizes.max_value_bytes
        ))
    };
    let action = match name.as_str() {
        "PING" => match n {
            0 => Action::Reply(Reply::Status("PONG".into())),
            1 => Action::Reply(Reply::Bulk(rest[0].clone())),
            _ => Action::Reply(arity(&name)),
        },
        "ECHO" if n == 1 => Action::Reply(Reply::Bulk(rest[0].clone())),
        "GET" if n == 1 => Action::Read(Read::Get { key: rest[0].clone() }),
        "MGET" if n >= 1 => Action::Read(Read::MGet { keys: rest.to_vec() }),
        "EXISTS" if n >= 1 => Action::Read(Read::Exists { keys: rest.to_vec() }),
        "STRLEN" if n == 1 => Action::Read(Read::StrLen { key: rest[0].clone() }),
        "DBSIZE" if n == 0 => Action::Read(Read::DbSize),
        "KEYS" if n == 1 => Action::Read(Read::Keys { pattern: rest[0].clone() }),
        "SCAN" if n >= 1 => parse_scan(rest),
        "SET" if n >= 2 => parse_set(rest),
        "GETSET" if n == 2 => Action::Write(Write::GetSet { key: rest[0].clone(), value: rest[1].clone() }),
        "DEL" if n >= 1 => Action::Write(Write::Del { keys: rest.to_vec() }),
        "INCR" | "DECR" if n == 1 => {
            let by = if name == "INCR" { 1 } else { -1 };
            Action::Write(Write::IncrBy { key: rest[0].clone(), by })
        }
        "INCRBY" | "DECRBY" if n == 2 => match parse_i64(&rest[1]) {
            None => Action::Reply(not_int()),
            Some(by) if name == "DECRBY" => match by.checked_neg() {
                None => Action::Reply(Reply::err("decrement would overflow")),
                Some(by) => Action::Write(Write::IncrBy { key: rest[0].clone(), by }),
            },
            Some(by) => Action::Write(Write::IncrBy { key: rest[0].clone(), by }),
        },
        "APPEND" if n == 2 => Action::Write(Write::Append { key: rest[0].clone(), value: rest[1].clone() }),
        "MSET" if n >= 2 && n.is_multiple_of(2) => Action::Write(Write::MSet {
            pairs: rest.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect(),
        }),
        "CAS" if n == 3 => Action::Write(Write::Cas {
            key: rest[0].clone(),
            expected: Some(rest[1].clone()),
            new: rest[2].clone(),
        }),
        "AUTH" if n == 1 => Action::Auth { user: None, password: rest[0].clone() },
        "AUTH" if n == 2 => Action::Auth { user: Some(rest[0].clone()), password: rest[1].clone() },
        "HELLO" => return parse_hello(rest),
        "SELECT" if n == 1 => match parse_i64(&rest[0]) {
            Some(0) => Action::Reply(Reply::Ok),
            Some(_) => Action::Reply(Reply::err("DB index is out of range (ordo-kv has database 0 only)")),
            None => Action::Reply(not_int()),
        },
        "CLIENT" if n >= 1 => {
            let sub = String::from_utf8_lossy(&rest[0]).to_ascii_uppercase();
            match (sub.as_str(), n) {
                ("SETNAME", 2) => Action::SetName(rest[1].clone()),
                ("GETNAME", 1) => Action::GetName,
                ("ID", 1) => Action::ClientId,
                ("SETINFO", 3) => Action::Reply(Reply::Ok),
                _ => Action::Reply(Reply::err(format!(
                    "unknown subcommand '{}'. Try CLIENT HELP.",
                    String::from_utf8_lossy(&rest[0])
                ))),
            }
        }
        // Clients ask for command docs at start; ordo-kv has none to give.
        "COMMAND" => match rest.first().map(|s| String::from_utf8_lossy(s).to_ascii_uppercase()) {
            Some(s) if s == "COUNT" => Action::Reply(Reply::Int(COMMANDS.len() as i64)),
            Some(s) if s == "DOCS" => Action::Reply(Reply::Map(Vec::new())),
            _ => Action::Reply(Reply::Array(Vec::new())),
        },
        "INFO" if n <= 1 => Action::Info,
        "READONLY" if n == 0 => Action::ReadOnly,
        "READWRITE" if n == 0 => Action::ReadWrite,
        "QUIT" => Action::Quit,
        "ORDO" if n == 1 && rest[0].eq_ignore_ascii_case(b"FORWARDED") => Action::Forwarded,
        known if COMMANDS.contains(&known) => Action::Reply(arity(known)),
        _ => {
            let shown: String = String::from_utf8_lossy(first).chars().take(128).collect();
            Action::Reply(Reply::err(format!("unknown command '{shown}', with args beginning with: ")))
        }
    };
    match &action {
        Action::Write(w) if !write_sizes_ok(w, &key_ok, &val_ok) => Action::Reply(too_big()),
        Action::Read(r) if !read_keys(r).iter().all(|k| key_ok(k)) => Action::Reply(too_big()),
        _ => action,
    }
}

/// Every command name ordo-kv knows.
pub const COMMANDS: &[&str] = &[
    "GET",
    "SET",
    "DEL",
    "EXISTS",
    "INCR",
    "INCRBY",
    "DECR",
    "DECRBY",
    "APPEND",
    "STRLEN",
    "MGET",
    "MSET",
    "GETSET",
    "DBSIZE",
    "SCAN",
    "KEYS",
    "PING",
    "ECHO",
    "INFO",
    "AUTH",
    "HELLO",
    "SELECT",
    "CLIENT",
    "COMMAND",
    "CAS",
    "READONLY",
    "READWRITE",
    "QUIT",
];

/// The keys (and patterns) a read names: each is bounded by
/// `max_key_bytes` (a pattern is matched against every key, so its length
/// bounds the work per key).
fn read_keys(r: &Read) -> Vec<&Vec<u8>> {
    match r {
        Read::Get { key } | Read::StrLen { key } | Read::Keys { pattern: key } => vec![key],
        Read::MGet { keys } | Read::Exists { keys } => keys.iter().collect(),
        Read::Scan { pattern, .. } => pattern.iter().collect(),
        Read::DbSize => Vec::new(),
    }
}

fn write_sizes_ok(w: &Write, key_ok: &dyn Fn(&Vec<u8>) -> bool, val_ok: &dyn Fn(&Vec<u8>) -> bool) -> bool {
    match w {
        Write::Set { key, value, .. } | Write::Append { key, value } | Write::GetSet { key, value } => {
            key_ok(key) && val_ok(value)
        }
        Write::Del { keys } => keys.iter().all(key_ok),
        Write::IncrBy { key, .. } => key_ok(key),
        Write::MSet { pairs } => pairs.iter().all(|(k, v)| key_ok(k) && val_ok(v)),
        Write::Cas { key, expected, new } => {
            key_ok(key) && val_ok(new) && expected.as_ref().is_none_or(val_ok)
        }
    }
}

fn parse_set(rest: &[Vec<u8>]) -> Action {
    let (key, value) = (rest[0].clone(), rest[1].clone());
    let (mut when, mut get, mut ttl) = (SetWhen::Always, false, Ttl::None);
    let mut i = 2;
    let mut ttl_set = false;
    while i < rest.len() {
        let opt = String::from_utf8_lossy(&rest[i]).to_ascii_uppercase();
        match opt.as_str() {
            "NX" if when == SetWhen::Always => when = SetWhen::Nx,
            "XX" if when == SetWhen::Always => when = SetWhen::Xx,
            "GET" if !get => get = true,
            "KEEPTTL" if !ttl_set => {
                ttl = Ttl::Keep;
                ttl_set = true;
            }
            "EX" | "PX" if !ttl_set && i + 1 < rest.len() => {
                i += 1;
                let Some(v) = parse_i64(&rest[i]) else { return Action::Reply(not_int()) };
                let ms = if opt == "EX" { v.checked_mul(1000) } else { Some(v) };
                match ms {
                    Some(ms) if ms > 0 => ttl = Ttl::Ms(ms as u64),
                    _ => return Action::Reply(Reply::err("invalid expire time in 'set' command")),
                }
                ttl_set = true;
            }
            _ => return Action::Reply(syntax()),
        }
        i += 1;
    }
    Action::Write(Write::Set { key, value, when, get, ttl })
}

fn parse_scan(rest: &[Vec<u8>]) -> Action {
    let Some(cursor) = std::str::from_utf8(&rest[0]).ok().and_then(|s| s.parse::<u64>().ok()) else {
        return Action::Reply(Reply::err("invalid cursor"));
    };
    let (mut pattern, mut count) = (None, 10usize);
    let mut i = 1;
    while i < rest.len() {
        let opt = String::from_utf8_lossy(&rest[i]).to_ascii_uppercase();
        match (opt.as_str(), rest.get(i + 1)) {
            ("MATCH", Some(p)) => pattern = Some(p.clone()),
            ("COUNT", Some(c)) => match parse_i64(c) {
                Some(c) if c >= 1 => count = (c as usize).min(100_000),
                Some(_) => return Action::Reply(syntax()),
                None => return Action::Reply(not_int()),
            },
            ("TYPE", Some(t)) if t.eq_ignore_ascii_case(b"string") => {}
            ("TYPE", Some(_)) => count = 0,
            _ => return Action::Reply(syntax()),
        }
        i += 2;
    }
    Action::Read(Read::Scan { cursor, pattern, count })
}

fn parse_hello(rest: &[Vec<u8>]) -> Action {
    let mut proto = None;
    let (mut auth, mut name) = (None, None);
    let mut i = 0;
    if let Some(p) = rest.first() {
        match parse_i64(p) {
            Some(v @ 2..=3) => proto = Some(v as u8),
            Some(_) => return Action::Reply(Reply::Error("NOPROTO unsupported protocol version".into())),
            None => return Action::Reply(Reply::err("Protocol version is not an integer or out of range")),
        }
        i = 1;
    }
    while i < rest.len() {
        let opt = String::from_utf8_lossy(&rest[i]).to_ascii_uppercase();
        match opt.as_str() {
            "AUTH" if i + 2 < rest.len() => {
                auth = Some((rest[i + 1].clone(), rest[i + 2].clone()));
                i += 3;
            }
            "SETNAME" if i + 1 < rest.len() => {
                name = Some(rest[i + 1].clone());
                i += 2;
            }
            _ => return Action::Reply(Reply::err(format!("Syntax error in HELLO option '{opt}'"))),
        }
    }
    Action::Hello { proto, auth, name }
}

/// Answers `read` from `state` as of wall clock `now_ms`. SCAN cursors are
/// positions handed out by `cursors` (the connection's table).
pub fn answer(read: &Read, state: &KvState, now_ms: u64, cursors: &mut ScanCursors) -> Reply {
    match read {
        Read::Get { key } => Reply::opt(state.get(key, now_ms)),
        Read::MGet { keys } => Reply::Array(keys.iter().map(|k| Reply::opt(state.get(k, now_ms))).collect()),
        Read::Exists { keys } => {
            Reply::Int(keys.iter().filter(|k| state.get(k, now_ms).is_some()).count() as i64)
        }
        Read::StrLen { key } => Reply::Int(state.get(key, now_ms).map_or(0, |v| v.len() as i64)),
        Read::DbSize => Reply::Int(state.len(now_ms) as i64),
        Read::Keys { pattern } => keys_in_chunks(|after| state.scan(after, Some(pattern), 1024, now_ms)),
        Read::Scan { cursor, pattern, count } => {
            let Some(after) = cursors.resume(*cursor) else {
                return Reply::err("invalid cursor");
            };
            let (keys, next) = if *count == 0 {
                (Vec::new(), None)
            } else {
                state.scan(after.as_deref(), pattern.as_deref(), *count, now_ms)
            };
            let next_cursor = next.map_or(0, |k| cursors.save(k));
            Reply::Array(vec![
                Reply::Bulk(next_cursor.to_string().into_bytes()),
                Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
            ])
        }
    }
}

/// KEYS as a walk of [`KvState::scan`] chunks: `chunk(after)` returns the
/// keys after `after` and where the next chunk starts (the server takes
/// the state lock once per chunk).
pub fn keys_in_chunks(mut chunk: impl FnMut(Option<&[u8]>) -> (Vec<Vec<u8>>, Option<Vec<u8>>)) -> Reply {
    let (mut out, mut after) = (Vec::new(), None::<Vec<u8>>);
    loop {
        let (keys, next) = chunk(after.as_deref());
        out.extend(keys.into_iter().map(Reply::Bulk));
        match next {
            None => return Reply::Array(out),
            Some(n) => after = Some(n),
        }
    }
}

/// A connection's SCAN cursors: a cursor number names the last key a SCAN
/// looked at (0: the start). At most `capacity` are kept (default
/// [`ScanCursors::MAX`]); an older cursor is forgotten (SCAN with it
/// answers `invalid cursor`).
#[derive(Debug)]
pub struct ScanCursors {
    next: u64,
    capacity: usize,
    saved: std::collections::VecDeque<(u64, Vec<u8>)>,
}

impl Default for ScanCursors {
    fn default() -> Self {
        ScanCursors::with_capacity(Self::MAX)
    }
}

impl ScanCursors {
    /// Cursors kept per client connection.
    pub const MAX: usize = 16;
    /// Cursors kept on a follower's forwarding link (its clients share it).
    pub const MAX_FORWARDED: usize = 4096;

    /// A table keeping at most `capacity` cursors.
    pub fn with_capacity(capacity: usize) -> ScanCursors {
        ScanCursors { next: 0, capacity: capacity.max(1), saved: std::collections::VecDeque::new() }
    }

    fn resume(&mut self, cursor: u64) -> Option<Option<Vec<u8>>> {
        if cursor == 0 {
            return Some(None);
        }
        let i = self.saved.iter().position(|(c, _)| *c == cursor)?;
        self.saved.remove(i).map(|(_, k)| Some(k))
    }

    fn save(&mut self, key: Vec<u8>) -> u64 {
        self.next += 1;
        if self.saved.len() >= self.capacity {
            self.saved.pop_front();
        }
        self.saved.push_back((self.next, key));
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Entry;

    const S: Sizes = Sizes { max_key_bytes: 8, max_value_bytes: 16 };

    fn p(line: &str) -> Action {
        let args: Vec<Vec<u8>> = line.split(' ').map(|a| a.as_bytes().to_vec()).collect();
        parse(&args, &S)
    }

    #[test]
    fn parsing_like_redis() {
        assert_eq!(p("get a"), Action::Read(Read::Get { key: b"a".to_vec() }));
        assert_eq!(p("GET"), Action::Reply(Reply::err("wrong number of arguments for 'get' command")));
        assert_eq!(
            p("set k v nx px 50"),
            Action::Write(Write::Set {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                when: SetWhen::Nx,
                get: false,
                ttl: Ttl::Ms(50)
            })
        );
        assert_eq!(p("set k v nx xx"), Action::Reply(Reply::err("syntax error")));
        assert_eq!(p("set k v ex 0"), Action::Reply(Reply::err("invalid expire time in 'set' command")));
        assert_eq!(p("set k v ex x"), Action::Reply(not_int()));
        assert_eq!(p("incrby k 1x"), Action::Reply(not_int()));
        assert!(
            matches!(p("flushall"), Action::Reply(Reply::Error(e)) if e.starts_with("ERR unknown command 'flushall'"))
        );
        assert!(matches!(p("set toolongkey v"), Action::Reply(Reply::Error(e)) if e.contains("too large")));
        assert!(matches!(p("get toolongkey"), Action::Reply(Reply::Error(e)) if e.contains("too large")));
        assert!(
            matches!(p("keys toolongpattern*"), Action::Reply(Reply::Error(e)) if e.contains("too large"))
        );
        assert!(
            matches!(p("scan 0 match toolongpattern*"), Action::Reply(Reply::Error(e)) if e.contains("too large"))
        );
        assert_eq!(p("select 0"), Action::Reply(Reply::Ok));
        assert!(matches!(p("select 1"), Action::Reply(Reply::Error(_))));
        assert_eq!(p("hello 3"), Action::Hello { proto: Some(3), auth: None, name: None });
        assert_eq!(p("hello 4"), Action::Reply(Reply::Error("NOPROTO unsupported protocol version".into())));
        assert_eq!(
            p("mset a 1 b"),
            Action::Reply(Reply::err("wrong number of arguments for 'mset' command"))
        );
    }

    #[test]
    fn scan_cursors_walk_the_table() {
        let mut s = KvState::new();
        for i in 0..25 {
            let w = Write::Set {
                key: format!("k{i:02}").into_bytes(),
                value: b"v".to_vec(),
                when: SetWhen::Always,
                get: false,
                ttl: Ttl::None,
            };
            s.apply(&Entry { origin: 0, nonce: 0, request: 0, now_ms: 1, write: w });
        }
        let mut cursors = ScanCursors::default();
        let (mut cursor, mut seen) = (0u64, 0usize);
        loop {
            let Reply::Array(parts) =
                answer(&Read::Scan { cursor, pattern: None, count: 10 }, &s, 1, &mut cursors)
            else {
                panic!("array")
            };
            let (Reply::Bulk(c), Reply::Array(keys)) = (&parts[0], &parts[1]) else { panic!("shape") };
            seen += keys.len();
            cursor = std::str::from_utf8(c).unwrap().parse().unwrap();
            if cursor == 0 {
                break;
            }
        }
        assert_eq!(seen, 25);
        assert_eq!(
            answer(&Read::Scan { cursor: 999, pattern: None, count: 10 }, &s, 1, &mut cursors),
            Reply::err("invalid cursor")
        );
    }
}
