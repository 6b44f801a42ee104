//! The simulated datagram network (what a UDP transport such as R2P2 runs on).
//!
//! # Invariants
//! - A datagram is addressed from one [`NetAddr`] (member, port) to another;
//!   its bytes are copied when it is sent.
//! - Per seed, a datagram may be lost, duplicated, or delayed by a random
//!   amount (so datagrams reorder, even between one pair); all of it is drawn
//!   from the network's own seeded stream.
//! - A datagram is lost if its pair is partitioned when it is sent or when it
//!   would arrive.
//! - Receive queues are bounded ([`NetConfig::queue_capacity`]): an arrival
//!   at a full queue is dropped and counted; so is one at a port nobody has
//!   bound.
//! - A crash unbinds every socket of the member and drops their queued
//!   datagrams; a restarted member binds afresh and starts with empty queues.
//!   Datagrams already on the wire when a member crashed still arrive (as on
//!   a real network): protocols must tell incarnations apart themselves.
//! - A socket handle belongs to one incarnation: after its member crashed it
//!   answers [`NetError::Closed`] and receives nothing.
//!
//! [`NetConfig::queue_capacity`]: crate::NetConfig::queue_capacity

use crate::world::{Event, World};
use ordo_fabric::MemberId;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

/// A datagram endpoint: a member and a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetAddr {
    /// The member (any incarnation of it).
    pub member: MemberId,
    /// The port on that member.
    pub port: u16,
}

impl NetAddr {
    /// The address of `port` on `member`.
    pub fn new(member: MemberId, port: u16) -> NetAddr {
        NetAddr { member, port }
    }
}

impl fmt::Display for NetAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "m{}:{}", self.member, self.port)
    }
}

/// Why a socket operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// The port is already bound by the member's current incarnation.
    #[error("address {0} is already in use")]
    AddrInUse(NetAddr),
    /// The socket's member crashed (or the member is not alive).
    #[error("socket {0} is closed: its member crashed")]
    Closed(NetAddr),
    /// The datagram is larger than the network carries.
    #[error("datagram of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The datagram's length.
        len: usize,
        /// The largest the network carries.
        max: usize,
    },
    /// No such member.
    #[error("member {0} does not exist")]
    UnknownMember(MemberId),
}

#[derive(Debug)]
struct Socket {
    incarnation: u64,
    rx: VecDeque<(NetAddr, Vec<u8>)>,
}

#[derive(Debug)]
struct Datagram {
    from: NetAddr,
    to: NetAddr,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
pub(crate) struct NetState {
    sockets: BTreeMap<NetAddr, Socket>,
    in_flight: BTreeMap<u64, Datagram>,
}

impl World {
    fn socket_open(&self, addr: NetAddr, incarnation: u64) -> bool {
        let m = &self.members[addr.member as usize];
        m.alive
            && m.incarnation == incarnation
            && self.net.sockets.get(&addr).is_some_and(|s| s.incarnation == incarnation)
    }

    pub(crate) fn net_bind(&mut self, addr: NetAddr, incarnation: u64) -> Result<(), NetError> {
        let m = self.members.get(addr.member as usize).ok_or(NetError::UnknownMember(addr.member))?;
        if !m.alive || m.incarnation != incarnation {
            return Err(NetError::Closed(addr));
        }
        if self.net.sockets.get(&addr).is_some_and(|s| s.incarnation == incarnation) {
            return Err(NetError::AddrInUse(addr));
        }
        self.net.sockets.insert(addr, Socket { incarnation, rx: VecDeque::new() });
        Ok(())
    }

    pub(crate) fn net_send(
        &mut self,
        from: NetAddr,
        incarnation: u64,
        to: NetAddr,
        bytes: &[u8],
    ) -> Result<(), NetError> {
        if !self.socket_open(from, incarnation) {
            return Err(NetError::Closed(from));
        }
        if to.member >= self.cfg.members {
            return Err(NetError::UnknownMember(to.member));
        }
        let max = self.cfg.net.max_datagram_len;
        if bytes.len() > max {
            return Err(NetError::TooLarge { len: bytes.len(), max });
        }
        self.stats.datagrams_sent += 1;
        if (from.member != to.member && self.is_cut(from.member, to.member))
            || self.rng_net.chance(self.cfg.net.loss_ppm)
        {
            self.stats.datagrams_lost += 1;
            return Ok(());
        }
        let copies = if self.rng_net.chance(self.cfg.net.duplicate_ppm) {
            self.stats.datagrams_duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let net = &self.cfg.net;
            let mut delay = self.rng_net.range(net.delay_min_ns, net.delay_max_ns);
            if self.rng_net.chance(net.spike_ppm) {
                delay += self.rng_net.range(0, net.spike_max_ns);
            }
            let id = self.fresh_id();
            self.net.in_flight.insert(id, Datagram { from, to, bytes: bytes.to_vec() });
            let at = self.now_ns() + delay;
            self.schedule(at, Event::Deliver { id });
        }
        Ok(())
    }

    pub(crate) fn net_recv(&mut self, addr: NetAddr, incarnation: u64) -> Option<(NetAddr, Vec<u8>)> {
        if !self.socket_open(addr, incarnation) {
            return None;
        }
        self.net.sockets.get_mut(&addr)?.rx.pop_front()
    }

    pub(crate) fn on_deliver(&mut self, id: u64) {
        let Some(d) = self.net.in_flight.remove(&id) else { return };
        if d.from.member != d.to.member && self.is_cut(d.from.member, d.to.member) {
            self.stats.datagrams_lost += 1;
            return;
        }
        let capacity = self.cfg.net.queue_capacity;
        let alive = self.members[d.to.member as usize].alive;
        match self.net.sockets.get_mut(&d.to) {
            Some(socket) if alive => {
                if socket.rx.len() >= capacity {
                    self.stats.datagrams_overflowed += 1;
                } else {
                    socket.rx.push_back((d.from, d.bytes));
                    self.stats.datagrams_delivered += 1;
                    self.wake(d.to.member);
                }
            }
            _ => self.stats.datagrams_unbound += 1,
        }
    }

    pub(crate) fn net_crash(&mut self, member: MemberId) {
        self.net.sockets.retain(|addr, _| addr.member != member);
    }
}

/// A bound datagram socket of one incarnation of a member.
#[derive(Clone)]
pub struct SimSocket {
    addr: NetAddr,
    incarnation: u64,
    world: Arc<Mutex<World>>,
}

impl fmt::Debug for SimSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSocket").field("addr", &self.addr).field("incarnation", &self.incarnation).finish()
    }
}

impl SimSocket {
    /// Binds `port` on `member`'s current incarnation `incarnation`.
    pub fn bind(
        world: &Arc<Mutex<World>>,
        member: MemberId,
        incarnation: u64,
        port: u16,
    ) -> Result<SimSocket, NetError> {
        let addr = NetAddr::new(member, port);
        world.lock().expect("world lock").net_bind(addr, incarnation)?;
        Ok(SimSocket { addr, incarnation, world: world.clone() })
    }

    /// This socket's address.
    pub fn local_addr(&self) -> NetAddr {
        self.addr
    }

    /// Sends `bytes` to `to`. `Ok` means handed to the network, which may
    /// still lose, duplicate or delay it.
    pub fn send(&mut self, to: NetAddr, bytes: &[u8]) -> Result<(), NetError> {
        self.world.lock().expect("world lock").net_send(self.addr, self.incarnation, to, bytes)
    }

    /// The oldest queued datagram and its sender, if any.
    pub fn recv(&mut self) -> Option<(NetAddr, Vec<u8>)> {
        self.world.lock().expect("world lock").net_recv(self.addr, self.incarnation)
    }

    /// Like [`recv`](Self::recv) into `buf`; a longer datagram is truncated
    /// (as UDP does). Returns the sender and the datagram's full length.
    pub fn recv_into(&mut self, buf: &mut [u8]) -> Option<(NetAddr, usize)> {
        let (from, bytes) = self.recv()?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Some((from, bytes.len()))
    }
}
