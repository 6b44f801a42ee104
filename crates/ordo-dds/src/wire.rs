//! The external-client protocol (spindle §II-A: external members' requests
//! are relayed through an internal member): length-prefixed frames over
//! TCP between an [`crate::client::ExternalParticipant`] and a member's
//! [`crate::relay`].
//!
//! ```text
//! frame = len: u32 LE (kind and body, 1..=max) | kind: u8 | body
//! HELLO      (client)  "ordo-dds" | version u16 | nonce 16
//! WELCOME    (relay)   "ordo-dds" | version u16 | member u32 | nonce 16 | proof 32
//! PROOF      (client)  proof 32
//! SUBSCRIBE  req u32 | after u64 | topic str8 | type str8
//! WRITER     req u32 | topic str8 | type str8
//! PUBLISH    topic u16 | key str16 | data…
//! FLUSH      req u32
//! OK         req u32 | topic u16 | qos u8 | max_sample u32
//! ERROR      req u32 | code u8 | message…
//! SAMPLE     topic u16 | source u32 | seq u64 | position u64 | view u64 | source_ns u64 | key str16 | data…
//! DROPPED    reason…
//! ```
//! The handshake is `ordo_auth::handshake` over the HELLO and WELCOME
//! frames with the cluster's **client secret** (label
//! [`HANDSHAKE_LABEL`]).
//!
//! # Invariants
//! - A frame's length is checked against the reader's bound before any
//!   byte of its body is read or allocated; every field is bounded by the
//!   frame; a frame that does not decode is a [`WireError`], never a panic.

use std::io::{self, Read, Write};

/// The protocol's magic.
pub const MAGIC: &[u8; 8] = b"ordo-dds";
/// The protocol's version.
pub const VERSION: u16 = 1;
/// The key-derivation label of the relay handshake.
pub const HANDSHAKE_LABEL: &str = "ordo dds relay v1";
/// Bytes around a sample's key and data in a SAMPLE frame.
pub const SAMPLE_OVERHEAD: usize = 1 + 2 + 4 + 8 * 4 + 2;
/// Longest error message sent.
pub const MAX_MESSAGE: usize = 512;

/// Why a request failed (ERROR's code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// No such topic.
    UnknownTopic = 1,
    /// The topic carries another type.
    TypeMismatch = 2,
    /// The relay's member does not publish the topic.
    NotAPublisher = 3,
    /// The relay's member is not in the topic.
    NotAMember = 4,
    /// A sample larger than the topic allows.
    TooLarge = 5,
    /// A frame that does not decode, or not expected now.
    Malformed = 6,
    /// PUBLISH on a topic without a WRITER first.
    NoWriter = 7,
    /// The member stopped, or the ring stayed full.
    Unavailable = 8,
}

impl ErrorCode {
    fn from_u8(b: u8) -> Option<ErrorCode> {
        Some(match b {
            1 => ErrorCode::UnknownTopic,
            2 => ErrorCode::TypeMismatch,
            3 => ErrorCode::NotAPublisher,
            4 => ErrorCode::NotAMember,
            5 => ErrorCode::TooLarge,
            6 => ErrorCode::Malformed,
            7 => ErrorCode::NoWriter,
            8 => ErrorCode::Unavailable,
            _ => return None,
        })
    }
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// The client's hello.
    Hello {
        /// Its nonce.
        nonce: [u8; 16],
    },
    /// The relay's hello and proof.
    Welcome {
        /// The relay's member.
        member: u32,
        /// Its nonce.
        nonce: [u8; 16],
        /// Its proof.
        proof: [u8; 32],
    },
    /// The client's proof.
    Proof {
        /// The proof.
        proof: [u8; 32],
    },
    /// Subscribe to a topic, from the sample after `after` (stored topics
    /// send their history above it first).
    Subscribe {
        /// Request id.
        req: u32,
        /// Last position the client has (0: none).
        after: u64,
        /// Topic name.
        topic: String,
        /// The client's type name (empty: any).
        type_name: String,
    },
    /// Declare a writer of a topic.
    Writer {
        /// Request id.
        req: u32,
        /// Topic name.
        topic: String,
        /// Type name (empty: any).
        type_name: String,
    },
    /// Publish a sample.
    Publish {
        /// The topic id an OK gave.
        topic: u16,
        /// Instance key.
        key: Vec<u8>,
        /// Serialized sample.
        data: Vec<u8>,
    },
    /// Answered once everything published before it is delivered (stable).
    Flush {
        /// Request id.
        req: u32,
    },
    /// A request succeeded.
    Ok {
        /// Request id.
        req: u32,
        /// Topic id.
        topic: u16,
        /// QoS level (index in `QosLevel::ALL`).
        qos: u8,
        /// The topic's largest sample.
        max_sample: u32,
    },
    /// A request failed.
    Error {
        /// Request id (0: not tied to a request, e.g. a PUBLISH).
        req: u32,
        /// Why.
        code: ErrorCode,
        /// For a person.
        message: String,
    },
    /// A sample of a subscribed topic.
    Sample {
        /// Topic id.
        topic: u16,
        /// Publishing member.
        source: u32,
        /// Writer sequence.
        seq: u64,
        /// Position.
        position: u64,
        /// View.
        view: u64,
        /// Writer clock.
        source_ns: u64,
        /// Key.
        key: Vec<u8>,
        /// Data.
        data: Vec<u8>,
    },
    /// The relay dropped this client.
    Dropped {
        /// Why.
        reason: String,
    },
}

/// What a frame decode can find wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// A length outside the reader's bound.
    #[error("frame of {0} bytes outside 1..={1}")]
    Length(usize, usize),
    /// Unknown kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A body that does not decode.
    #[error("malformed {0} frame")]
    Body(&'static str),
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const PROOF: u8 = 3;
const SUBSCRIBE: u8 = 10;
const WRITER: u8 = 11;
const PUBLISH: u8 = 12;
const FLUSH: u8 = 13;
const OK: u8 = 20;
const ERROR: u8 = 21;
const SAMPLE: u8 = 22;
const DROPPED: u8 = 23;

fn str8(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

fn bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

impl Frame {
    /// Appends the whole frame (length prefix included) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        match self {
            Frame::Hello { nonce } => {
                out.push(HELLO);
                out.extend_from_slice(MAGIC);
                out.extend_from_slice(&VERSION.to_le_bytes());
                out.extend_from_slice(nonce);
            }
            Frame::Welcome { member, nonce, proof } => {
                out.push(WELCOME);
                out.extend_from_slice(MAGIC);
                out.extend_from_slice(&VERSION.to_le_bytes());
                out.extend_from_slice(&member.to_le_bytes());
                out.extend_from_slice(nonce);
                out.extend_from_slice(proof);
            }
            Frame::Proof { proof } => {
                out.push(PROOF);
                out.extend_from_slice(proof);
            }
            Frame::Subscribe { req, after, topic, type_name } => {
                out.push(SUBSCRIBE);
                out.extend_from_slice(&req.to_le_bytes());
                out.extend_from_slice(&after.to_le_bytes());
                str8(out, topic);
                str8(out, type_name);
            }
            Frame::Writer { req, topic, type_name } => {
                out.push(WRITER);
                out.extend_from_slice(&req.to_le_bytes());
                str8(out, topic);
                str8(out, type_name);
            }
            Frame::Publish { topic, key, data } => {
                out.push(PUBLISH);
                out.extend_from_slice(&topic.to_le_bytes());
                bytes16(out, key);
                out.extend_from_slice(data);
            }
            Frame::Flush { req } => {
                out.push(FLUSH);
                out.extend_from_slice(&req.to_le_bytes());
            }
            Frame::Ok { req, topic, qos, max_sample } => {
                out.push(OK);
                out.extend_from_slice(&req.to_le_bytes());
                out.extend_from_slice(&topic.to_le_bytes());
                out.push(*qos);
                out.extend_from_slice(&max_sample.to_le_bytes());
            }
            Frame::Error { req, code, message } => {
                out.push(ERROR);
                out.extend_from_slice(&req.to_le_bytes());
                out.push(*code as u8);
                let m = message.as_bytes();
                let mut cut = m.len().min(MAX_MESSAGE);
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                out.extend_from_slice(&m[..cut]);
            }
            Frame::Sample { topic, source, seq, position, view, source_ns, key, data } => {
                out.push(SAMPLE);
                out.extend_from_slice(&topic.to_le_bytes());
                out.extend_from_slice(&source.to_le_bytes());
                for v in [seq, position, view, source_ns] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                bytes16(out, key);
                out.extend_from_slice(data);
            }
            Frame::Dropped { reason } => {
                out.push(DROPPED);
                out.extend_from_slice(&reason.as_bytes()[..reason.len().min(MAX_MESSAGE)]);
            }
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// The frame's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Decodes one frame's kind and body (the bytes after its length).
    pub fn decode(b: &[u8]) -> Result<Frame, WireError> {
        let (&kind, body) = b.split_first().ok_or(WireError::Length(0, 0))?;
        let mut r = Cursor { b: body, what: "frame" };
        let f = match kind {
            HELLO => {
                r.what = "HELLO";
                r.magic()?;
                Frame::Hello { nonce: r.array()? }
            }
            WELCOME => {
                r.what = "WELCOME";
                r.magic()?;
                Frame::Welcome { member: r.u32()?, nonce: r.array()?, proof: r.array()? }
            }
            PROOF => {
                r.what = "PROOF";
                Frame::Proof { proof: r.array()? }
            }
            SUBSCRIBE => {
                r.what = "SUBSCRIBE";
                Frame::Subscribe { req: r.u32()?, after: r.u64()?, topic: r.str8()?, type_name: r.str8()? }
            }
            WRITER => {
                r.what = "WRITER";
                Frame::Writer { req: r.u32()?, topic: r.str8()?, type_name: r.str8()? }
            }
            PUBLISH => {
                r.what = "PUBLISH";
                let topic = r.u16()?;
                let key = r.bytes16()?;
                return Ok(Frame::Publish { topic, key, data: r.rest() });
            }
            FLUSH => {
                r.what = "FLUSH";
                Frame::Flush { req: r.u32()? }
            }
            OK => {
                r.what = "OK";
                Frame::Ok { req: r.u32()?, topic: r.u16()?, qos: r.u8()?, max_sample: r.u32()? }
            }
            ERROR => {
                r.what = "ERROR";
                let req = r.u32()?;
                let code = ErrorCode::from_u8(r.u8()?).ok_or(WireError::Body("ERROR"))?;
                let message = String::from_utf8(r.rest()).map_err(|_| WireError::Body("ERROR"))?;
                return Ok(Frame::Error { req, code, message });
            }
            SAMPLE => {
                r.what = "SAMPLE";
                let (topic, source) = (r.u16()?, r.u32()?);
                let (seq, position, view, source_ns) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                let key = r.bytes16()?;
                return Ok(Frame::Sample {
                    topic,
                    source,
                    seq,
                    position,
                    view,
                    source_ns,
                    key,
                    data: r.rest(),
                });
            }
            DROPPED => {
                let reason = String::from_utf8(body.to_vec()).map_err(|_| WireError::Body("DROPPED"))?;
                return Ok(Frame::Dropped { reason });
            }
            k => return Err(WireError::Kind(k)),
        };
        if !r.b.is_empty() {
            return Err(WireError::Body(r.what));
        }
        Ok(f)
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.b.len() < n {
            return Err(WireError::Body(self.what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn magic(&mut self) -> Result<(), WireError> {
        if self.take(8)? != MAGIC || self.u16()? != VERSION {
            return Err(WireError::Body(self.what));
        }
        Ok(())
    }
    fn str8(&mut self) -> Result<String, WireError> {
        let n = self.u8()? as usize;
        let what = self.what;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| WireError::Body(what))
    }
    fn bytes16(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u16()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.b).to_vec()
    }
}

/// Reads one frame of at most `max` bytes (kind and body): the length is
/// checked before the body is read.
pub fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Result<Frame, WireError>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > max {
        return Ok(Err(WireError::Length(len, max)));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Frame::decode(&body))
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, f: &Frame) -> io::Result<()> {
    w.write_all(&f.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all() -> Vec<Frame> {
        vec![
            Frame::Hello { nonce: [1; 16] },
            Frame::Welcome { member: 3, nonce: [2; 16], proof: [3; 32] },
            Frame::Proof { proof: [4; 32] },
            Frame::Subscribe { req: 1, after: 9, topic: "t".into(), type_name: "bytes".into() },
            Frame::Writer { req: 2, topic: "t".into(), type_name: String::new() },
            Frame::Publish { topic: 1, key: b"k".to_vec(), data: vec![5; 100] },
            Frame::Flush { req: 7 },
            Frame::Ok { req: 1, topic: 0, qos: 2, max_sample: 1024 },
            Frame::Error { req: 1, code: ErrorCode::TypeMismatch, message: "no".into() },
            Frame::Sample {
                topic: 1,
                source: 2,
                seq: 3,
                position: 4,
                view: 5,
                source_ns: 6,
                key: vec![],
                data: vec![7; 10],
            },
            Frame::Dropped { reason: "slow".into() },
        ]
    }

    #[test]
    fn frames_round_trip_and_cuts_are_refused() {
        for f in all() {
            let b = f.to_bytes();
            let got = read_frame(&mut &b[..], 1 << 20).unwrap().unwrap();
            assert_eq!(got, f);
            // A frame cut short is an error (publish and sample data may
            // be empty, so cut inside their fixed part).
            let fixed = match f {
                Frame::Publish { .. }
                | Frame::Sample { .. }
                | Frame::Error { .. }
                | Frame::Dropped { .. } => 4,
                _ => b.len() - 1,
            };
            for cut in 5..fixed.max(5) {
                assert!(Frame::decode(&b[4..cut]).is_err(), "{f:?} cut at {cut}");
            }
        }
        // A length over the bound is refused before reading the body.
        let mut big = (1u32 << 30).to_le_bytes().to_vec();
        big.push(1);
        assert!(read_frame(&mut &big[..], 1024).unwrap().is_err());
        assert!(Frame::decode(&[99]).is_err());
        assert!(Frame::decode(&[HELLO, b'x']).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Frame::decode(&b);
            let _ = read_frame(&mut &b[..], 256);
        }
    }
}
