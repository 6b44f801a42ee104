//! The region layout and command protocol between a benchmark coordinator
//! (member 0) and its peer process (member 1). Both sides use only the
//! [`Fabric`] trait, so the same code measures every backend.
//!
//! ```text
//! offset   0  cmd_seq (guard of the command below)     coordinator → peer
//!          8  op | 16 size | 24 count | 32 slots
//!         64  done_seq                                   peer → coordinator
//!        128  ping counter                               coordinator → peer
//!        192  pong counter                               peer → coordinator
//!        256  stream ack (messages consumed)             peer → coordinator
//!        320  stream seq (guard of the stream slots)     coordinator → peer
//!       4096  ping payload (64 KiB)
//!      69632  pong payload (64 KiB)
//!     135168  stream slots (up to 1 MiB)
//! ```
//! Every message is published by a guard word written after its data, as
//! the fabric requires. Counters only grow across commands.

use ordo_fabric::{Doorbell, Fabric, FabricEvent, PostError, Write};
use std::time::{Duration, Instant};

/// Command sequence number, written by the coordinator. Guards the command
/// words [`CMD_OP`]..=[`CMD_SLOTS`]: they are posted first, then this word,
/// so a peer that sees it grow reads a complete new command.
pub const CMD_SEQ: usize = 0;
/// Command word, written by the coordinator: the [`Op`] as `u64`. Guarded by
/// [`CMD_SEQ`].
pub const CMD_OP: usize = 8;
/// Command word, written by the coordinator: message size in bytes (non-zero,
/// at most [`MAX_SIZE`]; the peer checks). Guarded by [`CMD_SEQ`].
pub const CMD_SIZE: usize = 16;
/// Command word, written by the coordinator: how many pings to echo
/// ([`Op::PingPong`]) or stream messages to consume ([`Op::Sink`]). Guarded
/// by [`CMD_SEQ`].
pub const CMD_COUNT: usize = 24;
/// Command word, written by the coordinator: number of stream slots for
/// [`Op::Sink`] (non-zero, `slots * size` ≤ [`STREAM_BYTES`]; 0 for other
/// ops). Guarded by [`CMD_SEQ`].
pub const CMD_SLOTS: usize = 32;
/// Completion word, written by the peer: the [`CMD_SEQ`] of the last command
/// it finished, written after that command's last pong or ack. The
/// coordinator waits for it before issuing the next command.
pub const DONE: usize = 64;
/// Ping counter, written by the coordinator: number of the latest ping. Guards
/// [`PING_DATA`] for sizes above 8 B; for an 8 B ping this word is the whole
/// payload.
pub const PING: usize = 128;
/// Pong counter, written by the peer: number of the latest ping echoed. Guards
/// [`PONG_DATA`] for sizes above 8 B.
pub const PONG: usize = 192;
/// Stream acknowledgement, written by the peer: how many stream messages it
/// has consumed (cumulative). Flow control: the coordinator reuses a slot
/// only after the message that last held it is acknowledged.
pub const ACK: usize = 256;
/// Stream sequence number, written by the coordinator: the last stream
/// message written (cumulative). Guards the slots at [`STREAM`]: every
/// message up to it is visible once the peer sees it.
pub const STREAM_SEQ: usize = 320;
/// Ping payload ([`MAX_SIZE`] bytes), written by the coordinator. Its first
/// word holds the ping's number, checked by the peer under [`PING`].
pub const PING_DATA: usize = 4096;
/// Pong payload ([`MAX_SIZE`] bytes), written by the peer. Its first word
/// holds the echoed ping's number, checked by the coordinator under [`PONG`].
pub const PONG_DATA: usize = PING_DATA + MAX_SIZE;
/// Stream slots ([`STREAM_BYTES`] bytes), written by the coordinator. Message
/// `m` goes to slot `m % slots` at `STREAM + slot * size`; its first word is
/// `m` and its last `!m`, checked by the peer under [`STREAM_SEQ`].
pub const STREAM: usize = PONG_DATA + MAX_SIZE;
/// Largest message size in bytes (64 KiB): the size of each of the ping and
/// pong payloads, and the tcp backend's frame limit in the benchmark.
pub const MAX_SIZE: usize = 64 * 1024;
/// Size in bytes of the stream slots (1 MiB); a [`Op::Sink`] command's
/// `slots * size` must fit in it.
pub const STREAM_BYTES: usize = 1024 * 1024;
/// Region length every benchmark member registers.
pub const REGION_LEN: usize = STREAM + STREAM_BYTES;

/// Operations a coordinator asks of its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Op {
    /// Echo `count` pings of `size` bytes.
    PingPong = 1,
    /// Consume `count` streamed messages of `size` bytes in `slots` slots.
    Sink = 2,
    /// Exit.
    Exit = 3,
    /// Like [`Op::Sink`], but checks only the newest message of each batch
    /// it observes: the receiver does not pull every slot's cache lines
    /// back to its core, as a consumer of a one-sided write stream (an RDMA
    /// write benchmark) would not. Used for bandwidth figures.
    SinkSampled = 4,
    /// Like [`Op::Sink`], and the peer reads every byte of every message
    /// (a checksum over its words), as an application consuming the stream
    /// does: what the cross-process copy ring limit is compared with.
    SinkRead = 5,
}

impl Op {
    /// The op whose `u64` value (as written to [`CMD_OP`]) is `v`; `None` for
    /// an unknown value.
    pub fn from_u64(v: u64) -> Option<Op> {
        match v {
            1 => Some(Op::PingPong),
            2 => Some(Op::Sink),
            3 => Some(Op::Exit),
            4 => Some(Op::SinkSampled),
            5 => Some(Op::SinkRead),
            _ => None,
        }
    }
}

/// How a side waits for a word to change: spin (cores to spare), or spin a
/// little and then park on the doorbell (when a receive thread needs the
/// core). Always bounded by a deadline.
pub struct Waiter {
    /// The doorbell to park on (for at most 1 ms at a time) once
    /// `spins_before_park` checks failed; `None` to spin only.
    pub park: Option<Doorbell>,
    /// Failed checks of the condition before parking starts.
    pub spins_before_park: u32,
    /// How long one [`Waiter::until`] waits before giving up with `Err`.
    pub deadline: Duration,
}

impl Waiter {
    /// Waits until `cond()` holds; `Err` after the deadline.
    pub fn until<F: Fabric>(
        &self,
        fabric: &mut F,
        mut cond: impl FnMut(&mut F) -> bool,
    ) -> Result<(), String> {
        let start = Instant::now();
        let mut spins = 0u32;
        let mut events = Vec::new();
        loop {
            if cond(fabric) {
                return Ok(());
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                fabric.poll_events(&mut events);
                if let Some(FabricEvent::Suspected { peer, cause }) =
                    events.iter().find(|e| matches!(e, FabricEvent::Suspected { .. }))
                {
                    return Err(format!("peer {peer} suspected: {cause}"));
                }
                events.clear();
                if start.elapsed() > self.deadline {
                    return Err(format!("no progress within {:?}", self.deadline));
                }
            }
            match &self.park {
                Some(bell) if spins > self.spins_before_park => {
                    let token = bell.prepare_park();
                    if cond(fabric) {
                        bell.cancel(token);
                        return Ok(());
                    }
                    bell.park(token, Duration::from_millis(1));
                }
                _ => std::hint::spin_loop(),
            }
        }
    }
}

/// Posts a write, retrying while the backend applies back-pressure.
pub fn post<F: Fabric>(fabric: &mut F, peer: u32, offset: usize, len: usize) -> Result<(), String> {
    let start = Instant::now();
    let mut events = Vec::new();
    loop {
        match fabric.post_write(Write::new(peer, offset, len)) {
            Ok(()) => return Ok(()),
            Err(PostError::Backpressure(_)) if start.elapsed() < Duration::from_secs(30) => {
                fabric.poll_events(&mut events);
                std::thread::yield_now();
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
