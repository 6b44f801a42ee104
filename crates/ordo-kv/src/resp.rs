//! RESP framing for the server: requests in (arrays of bulk strings, as
//! every client sends them, or inline commands as typed into telnet),
//! replies out in RESP2 or RESP3, through the `redis-protocol` codec.
//!
//! # Invariants
//! - A request is decoded only once it is complete; before the codec sees
//!   a frame, its array header is checked against `max_args`, and a
//!   connection's unparsed bytes never exceed `max_request_bytes` (a
//!   request that would is an error, the connection is closed): a peer
//!   lying about a length makes the server hold no more than the bound.
//! - Decoding never changes state: a malformed request is reported as a
//!   [`FrameError`] and the caller answers it and closes the connection.

use crate::state::Reply;
use redis_protocol::resp2::types::{OwnedFrame as Frame2, Resp2Frame};
use redis_protocol::resp3::types::{OwnedFrame as Frame3, Resp3Frame};

/// Bounds on what one client may send.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most arguments in one command (the name included).
    pub max_args: usize,
    /// Most bytes of one request, and of the unparsed input a connection
    /// may hold.
    pub max_request_bytes: usize,
}

/// Why the input of a connection cannot be read as requests.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not RESP (or a frame that is not an array of bulk strings).
    #[error("Protocol error: {0}")]
    Protocol(String),
    /// More arguments than allowed.
    #[error("Protocol error: {args} arguments exceed the limit of {max}")]
    TooManyArgs {
        /// Announced.
        args: usize,
        /// The limit.
        max: usize,
    },
    /// A request larger than allowed.
    #[error("Protocol error: request larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
}

/// A request's arguments and the bytes it took.
pub type Request = (Vec<Vec<u8>>, usize);

/// Takes the first complete request off `buf`: `Ok(Some((args, used)))`,
/// `Ok(None)` while it is incomplete (and within bounds).
pub fn next_request(buf: &[u8], limits: &Limits) -> Result<Option<Request>, FrameError> {
    let Some(&first) = buf.first() else { return Ok(None) };
    if first != b'*' {
        return inline(buf, limits);
    }
    // The array header: bound the count before the codec allocates.
    let Some(eol) = buf.iter().position(|b| *b == b'\n') else {
        return if buf.len() > 32 {
            Err(FrameError::Protocol("array header too long".into()))
        } else {
            Ok(None)
        };
    };
    let header = std::str::from_utf8(&buf[1..eol]).ok().map(|s| s.trim_end_matches('\r'));
    let n: i64 = header
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| FrameError::Protocol("invalid multibulk length".into()))?;
    if n < 0 || n as usize > limits.max_args {
        return Err(FrameError::TooManyArgs { args: n.max(0) as usize, max: limits.max_args });
    }
    // Every element must be a bulk string: checked by walking the headers
    // (no recursion), so the codec below never sees nested arrays.
    match flat_array_len(buf, eol + 1, n as usize, limits)? {
        None if buf.len() >= limits.max_request_bytes => {
            return Err(FrameError::TooLarge { max: limits.max_request_bytes });
        }
        None => return Ok(None),
        Some(_) => {}
    }
    let frame = match redis_protocol::resp2::decode::decode(buf) {
        Ok(Some((frame, used))) => {
            if used > limits.max_request_bytes {
                return Err(FrameError::TooLarge { max: limits.max_request_bytes });
            }
            (frame, used)
        }
        Ok(None) if buf.len() >= limits.max_request_bytes => {
            return Err(FrameError::TooLarge { max: limits.max_request_bytes });
        }
        Ok(None) => return Ok(None),
        Err(e) => return Err(FrameError::Protocol(e.details().to_string())),
    };
    let (Frame2::Array(items), used) = frame else {
        return Err(FrameError::Protocol("expected an array".into()));
    };
    let args = items
        .into_iter()
        .map(|f| match f {
            Frame2::BulkString(b) => Ok(b),
            _ => Err(FrameError::Protocol("expected bulk strings".into())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some((args, used)))
}

/// Walks `n` bulk strings starting at `at`: the request's length once all
/// are there (`None` while incomplete); an element that is not a bulk
/// string, or a length over the bound, is an error.
fn flat_array_len(buf: &[u8], mut at: usize, n: usize, limits: &Limits) -> Result<Option<usize>, FrameError> {
    for _ in 0..n {
        let Some(&kind) = buf.get(at) else { return Ok(None) };
        if kind != b'$' {
            return Err(FrameError::Protocol("expected bulk strings".into()));
        }
        let Some(eol) = buf[at..].iter().take(24).position(|b| *b == b'\n') else {
            return if buf.len() - at > 24 {
                Err(FrameError::Protocol("invalid bulk length".into()))
            } else {
                Ok(None)
            };
        };
        let len: i64 = std::str::from_utf8(&buf[at + 1..at + eol])
            .ok()
            .map(|s| s.trim_end_matches('\r'))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| FrameError::Protocol("invalid bulk length".into()))?;
        if len < 0 {
            return Err(FrameError::Protocol("invalid bulk length".into()));
        }
        if len as u64 > limits.max_request_bytes as u64 {
            return Err(FrameError::TooLarge { max: limits.max_request_bytes });
        }
        at += eol + 1 + len as usize + 2;
        if at > buf.len() {
            return Ok(None);
        }
    }
    Ok(Some(at))
}

/// Nesting a reply may have (ordo-kv's deepest is 2: SCAN).
pub const MAX_REPLY_DEPTH: usize = 8;

/// Walks one RESP2 reply's headers without recursion: its length once
/// complete (`None` while incomplete); nesting deeper than
/// [`MAX_REPLY_DEPTH`] is an error.
fn reply_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let mut at = 0usize;
    let mut pending: Vec<u64> = vec![1];
    while let Some(left) = pending.last_mut() {
        if *left == 0 {
            pending.pop();
            continue;
        }
        *left -= 1;
        let Some(&kind) = buf.get(at) else { return Ok(None) };
        let Some(eol) = buf[at..].iter().position(|b| *b == b'\n') else { return Ok(None) };
        let line = std::str::from_utf8(&buf[at + 1..at + eol]).ok().map(|s| s.trim_end_matches('\r'));
        at += eol + 1;
        let num = || {
            line.and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| FrameError::Protocol("invalid length".into()))
        };
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let len = num()?;
                if len >= 0 {
                    at += len as usize + 2;
                    if at > buf.len() {
                        return Ok(None);
                    }
                }
            }
            b'*' => {
                let len = num()?;
                if len > 0 {
                    if pending.len() >= MAX_REPLY_DEPTH {
                        return Err(FrameError::Protocol("reply nested too deep".into()));
                    }
                    pending.push(len as u64);
                }
            }
            _ => return Err(FrameError::Protocol("unknown reply type".into())),
        }
    }
    Ok(Some(at))
}

/// An inline command: one line, arguments separated by spaces.
fn inline(buf: &[u8], limits: &Limits) -> Result<Option<Request>, FrameError> {
    let Some(eol) = buf.iter().position(|b| *b == b'\n') else {
        return if buf.len() > limits.max_request_bytes.min(64 << 10) {
            Err(FrameError::TooLarge { max: limits.max_request_bytes.min(64 << 10) })
        } else {
            Ok(None)
        };
    };
    let line = &buf[..eol];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let args: Vec<Vec<u8>> =
        line.split(|b| *b == b' ' || *b == b'\t').filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect();
    if args.len() > limits.max_args {
        return Err(FrameError::TooManyArgs { args: args.len(), max: limits.max_args });
    }
    Ok(Some((args, eol + 1)))
}

fn to_frame2(r: &Reply) -> Frame2 {
    match r {
        Reply::Ok => Frame2::SimpleString(b"OK".to_vec()),
        Reply::Status(s) => Frame2::SimpleString(s.as_bytes().to_vec()),
        Reply::Nil => Frame2::Null,
        Reply::Int(i) => Frame2::Integer(*i),
        Reply::Bulk(b) => Frame2::BulkString(b.clone()),
        Reply::Error(e) => Frame2::Error(e.clone()),
        Reply::Array(a) => Frame2::Array(a.iter().map(to_frame2).collect()),
        Reply::Map(m) => Frame2::Array(m.iter().flat_map(|(k, v)| [to_frame2(k), to_frame2(v)]).collect()),
    }
}

fn to_frame3(r: &Reply) -> Frame3 {
    match r {
        Reply::Ok => Frame3::SimpleString { data: b"OK".to_vec(), attributes: None },
        Reply::Status(s) => Frame3::SimpleString { data: s.as_bytes().to_vec(), attributes: None },
        Reply::Nil => Frame3::Null,
        Reply::Int(i) => Frame3::Number { data: *i, attributes: None },
        Reply::Bulk(b) => Frame3::BlobString { data: b.clone(), attributes: None },
        Reply::Error(e) => Frame3::SimpleError { data: e.clone(), attributes: None },
        Reply::Array(a) => Frame3::Array { data: a.iter().map(to_frame3).collect(), attributes: None },
        Reply::Map(m) => Frame3::Map {
            data: m.iter().map(|(k, v)| (to_frame3(k), to_frame3(v))).collect(),
            attributes: None,
        },
    }
}

/// Appends `reply` to `out` in protocol version `proto` (2 or 3).
pub fn encode(reply: &Reply, proto: u8, out: &mut Vec<u8>) {
    let start = out.len();
    if proto >= 3 {
        let f = to_frame3(reply);
        out.resize(start + f.encode_len(false), 0);
        redis_protocol::resp3::encode::complete::encode(&mut out[start..], &f, false)
            .expect("the buffer was sized by encode_len");
    } else {
        let f = to_frame2(reply);
        out.resize(start + f.encode_len(false), 0);
        redis_protocol::resp2::encode::encode(&mut out[start..], &f, false)
            .expect("the buffer was sized by encode_len");
    }
}

/// Appends a request (an array of bulk strings) to `out` (RESP2).
pub fn encode_request(args: &[Vec<u8>], out: &mut Vec<u8>) {
    let f = Frame2::Array(args.iter().map(|a| Frame2::BulkString(a.clone())).collect());
    let start = out.len();
    out.resize(start + f.encode_len(false), 0);
    redis_protocol::resp2::encode::encode(&mut out[start..], &f, false).expect("sized by encode_len");
}

/// Decodes one RESP2 reply off `buf` (a forwarding link, a client):
/// `Ok(None)` while incomplete.
pub fn next_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, FrameError> {
    fn conv(f: Frame2) -> Reply {
        match f {
            Frame2::SimpleString(s) if s == b"OK" => Reply::Ok,
            Frame2::SimpleString(s) => Reply::Status(String::from_utf8_lossy(&s).into_owned()),
            Frame2::Error(e) => Reply::Error(e.to_string()),
            Frame2::Integer(i) => Reply::Int(i),
            Frame2::BulkString(b) => Reply::Bulk(b),
            Frame2::Array(a) => Reply::Array(a.into_iter().map(conv).collect()),
            Frame2::Null => Reply::Nil,
        }
    }
    if reply_len(buf)?.is_none() {
        return Ok(None);
    }
    match redis_protocol::resp2::decode::decode(buf) {
        Ok(Some((f, used))) => Ok(Some((conv(f), used))),
        Ok(None) => Ok(None),
        Err(e) => Err(FrameError::Protocol(e.details().to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { max_args: 4, max_request_bytes: 64 };

    #[test]
    fn requests_frame_and_bound() {
        let req = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*1\r\n$4\r\nPING\r\n";
        let (args, used) = next_request(req, &L).unwrap().unwrap();
        assert_eq!(args, vec![b"GET".to_vec(), b"a".to_vec()]);
        let (args, _) = next_request(&req[used..], &L).unwrap().unwrap();
        assert_eq!(args, vec![b"PING".to_vec()]);
        for cut in 1..req.len() - 14 {
            assert_eq!(next_request(&req[..cut.min(used - 1)], &L), Ok(None), "cut {cut}");
        }
        assert_eq!(next_request(b"PING  x\r\n", &L), Ok(Some((vec![b"PING".to_vec(), b"x".to_vec()], 9))));
        assert!(matches!(next_request(b"*5\r\n", &L), Err(FrameError::TooManyArgs { args: 5, max: 4 })));
        assert!(matches!(next_request(b"*-5\r\n", &L), Err(FrameError::TooManyArgs { .. })));
        assert!(matches!(next_request(b"*x\r\n", &L), Err(FrameError::Protocol(_))));
        // A length that lies: the bytes never arrive, the buffer is bounded.
        let liar = [b"*1\r\n$1000000\r\n".as_slice(), &[b'x'; 60]].concat();
        assert!(matches!(next_request(&liar, &L), Err(FrameError::TooLarge { max: 64 })));
        assert!(matches!(next_request(b"*1\r\n:5\r\n", &L), Err(FrameError::Protocol(_))));
        // Nested arrays are refused before the codec recurses into them.
        let nested = b"*1\r\n".repeat(20_000);
        let big = Limits { max_args: 4, max_request_bytes: 1 << 20 };
        assert!(matches!(next_request(&nested, &big), Err(FrameError::Protocol(_))));
        assert!(matches!(next_reply(&nested), Err(FrameError::Protocol(_))));
        assert_eq!(next_reply(b"*2\r\n*1\r\n:1\r\n$-1\r\n").unwrap().unwrap().1, 17);
    }

    #[test]
    fn replies_in_both_protocols() {
        let mut out = Vec::new();
        encode(&Reply::Nil, 2, &mut out);
        encode(&Reply::Nil, 3, &mut out);
        encode(&Reply::Array(vec![Reply::Int(1), Reply::Bulk(b"x".to_vec())]), 2, &mut out);
        encode(&Reply::err("boom"), 2, &mut out);
        assert_eq!(out, b"$-1\r\n_\r\n*2\r\n:1\r\n$1\r\nx\r\n-ERR boom\r\n");
        let (r, used) = next_reply(b"*2\r\n:1\r\n$-1\r\n").unwrap().unwrap();
        assert_eq!((r, used), (Reply::Array(vec![Reply::Int(1), Reply::Nil]), 13));
    }
}
