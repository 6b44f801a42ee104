//! Batched UDP system calls: `recvmmsg(2)` and `sendmmsg(2)` (Linux), a
//! thin safe layer over `libc` for the server's network thread.
//!
//! One `recvmmsg` reads a whole batch of datagrams where `recv_from` took a
//! system call each; the datagrams a loop turn sends (answers, Raft
//! messages to every peer) are queued and leave in one `sendmmsg` at the
//! end of the turn.
//!
//! # Invariants
//! - Every receive buffer holds a whole datagram (`MAX_DATAGRAM + 1`
//!   bytes): a datagram is never handed on truncated (a truncated one — not
//!   possible over IPv4/IPv6 UDP at that size — is dropped and counted as
//!   an error).
//! - The send queue keeps posting order per destination (one `sendmmsg`
//!   sends in array order) and is bounded: past `max_queued` datagrams a
//!   push flushes first.
//! - The iovec and header arrays point into buffers owned by `self` and
//!   are rebuilt before every call, so no pointer outlives a resize.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

/// Largest batch one system call handles (the kernel's `UIO_MAXIOV`).
const MAX_BATCH: usize = 1024;

/// A receive batch: buffers, source addresses and lengths of the last
/// [`recv`](Self::recv).
pub(crate) struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    truncated: Vec<bool>,
    /// Room for a source address in each header (fixed).
    namelens: Vec<libc::socklen_t>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs`/`hdrs` point only into `bufs`/`addrs`
// of the same value and are rebuilt before each use.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// Room for `n` datagrams of up to `buf_len` bytes each.
    pub(crate) fn new(n: usize, buf_len: usize) -> RecvBatch {
        let n = n.clamp(1, MAX_BATCH);
        RecvBatch {
            bufs: (0..n).map(|_| vec![0u8; buf_len]).collect(),
            // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
            addrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            lens: vec![0; n],
            truncated: vec![false; n],
            namelens: vec![size_of::<libc::sockaddr_storage>() as libc::socklen_t; n],
            iovs: Vec::with_capacity(n),
            hdrs: Vec::with_capacity(n),
        }
    }

    /// Reads up to the batch's size of datagrams without blocking; returns
    /// how many (0 when none is waiting).
    pub(crate) fn recv(&mut self, socket: &impl AsRawFd) -> io::Result<usize> {
        let n = self.bufs.len();
        self.iovs.clear();
        for b in &mut self.bufs {
            self.iovs.push(libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() });
        }
        build_headers(&mut self.hdrs, &mut self.addrs, &mut self.iovs, &self.namelens);
        loop {
            // SAFETY: `hdrs` holds `n` headers whose name and iovec pointers
            // point into live buffers of `self` (rebuilt above).
            let got = unsafe {
                libc::recvmmsg(
                    socket.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if got >= 0 {
                let got = got as usize;
                for i in 0..got {
                    self.lens[i] = self.hdrs[i].msg_len as usize;
                    self.truncated[i] = self.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
                }
                return Ok(got);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        }
    }

    /// Datagram `i` of the last receive: its source and bytes, or `None`
    /// when it was truncated or its source is not an IP address.
    pub(crate) fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        if self.truncated[i] {
            return None;
        }
        Some((from_storage(&self.addrs[i])?, &self.bufs[i][..self.lens[i]]))
    }
}

/// Datagrams queued for one `sendmmsg`.
pub(crate) struct SendQueue {
    to: Vec<SocketAddr>,
    bufs: Vec<Vec<u8>>,
    len: usize,
    max_queued: usize,
    addrs: Vec<libc::sockaddr_storage>,
    namelens: Vec<libc::socklen_t>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: as for `RecvBatch`.
unsafe impl Send for SendQueue {}

/// What a flush did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flushed {
    /// Datagrams the kernel took.
    pub sent: usize,
    /// Datagrams dropped (an error for that datagram, or a full socket
    /// buffer for too long).
    pub dropped: usize,
}

impl SendQueue {
    /// A queue that flushes by itself once `max_queued` datagrams wait.
    pub(crate) fn new(max_queued: usize) -> SendQueue {
        SendQueue {
            to: Vec::new(),
            bufs: Vec::new(),
            len: 0,
            max_queued: max_queued.clamp(1, MAX_BATCH),
            addrs: Vec::new(),
            namelens: Vec::new(),
            iovs: Vec::new(),
            hdrs: Vec::new(),
        }
    }

    /// Datagrams waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queues a copy of `datagram` for `to` (flushing first when full).
    pub(crate) fn push(&mut self, socket: &impl AsRawFd, to: SocketAddr, datagram: &[u8]) -> Flushed {
        let flushed = if self.len == self.max_queued { self.flush(socket) } else { Flushed::default() };
        if self.len == self.bufs.len() {
            self.bufs.push(Vec::new());
            self.to.push(to);
        }
        self.bufs[self.len].clear();
        self.bufs[self.len].extend_from_slice(datagram);
        self.to[self.len] = to;
        self.len += 1;
        flushed
    }

    /// Sends every queued datagram, in order: one `sendmmsg` per batch,
    /// retrying briefly while the socket buffer is full (then the rest is
    /// dropped: UDP senders may drop); a datagram the kernel refuses (e.g.
    /// ECONNREFUSED after an ICMP error) is dropped and the rest go on.
    pub(crate) fn flush(&mut self, socket: &impl AsRawFd) -> Flushed {
        let mut out = Flushed::default();
        let n = self.len;
        if n == 0 {
            return out;
        }
        // Reused arrays: no allocation per turn once warm.
        self.addrs.clear();
        self.namelens.clear();
        self.iovs.clear();
        for i in 0..n {
            let (storage, len) = to_storage(self.to[i]);
            self.addrs.push(storage);
            self.namelens.push(len);
            self.iovs.push(libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            });
        }
        build_headers(&mut self.hdrs, &mut self.addrs, &mut self.iovs, &self.namelens);
        let (mut at, mut full_tries) = (0, 0);
        while at < n {
            // SAFETY: headers `at..n` point into live buffers of `self`
            // (built above, not resized since).
            let rc = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    self.hdrs[at..].as_mut_ptr(),
                    (n - at) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if rc > 0 {
                at += rc as usize;
                out.sent += rc as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock if full_tries < 1000 => {
                    full_tries += 1;
                    std::thread::yield_now();
                }
                io::ErrorKind::WouldBlock => {
                    tracing::debug!(dropped = n - at, "r2p2 send buffer full");
                    out.dropped += n - at;
                    at = n;
                }
                _ => {
                    tracing::debug!(error = %e, to = %self.to[at], "r2p2 send failed");
                    out.dropped += 1;
                    at += 1;
                }
            }
        }
        self.len = 0;
        out
    }
}

/// One header per datagram `i`: address `addrs[i]` of `namelens[i]` bytes,
/// one buffer `iovs[i]`.
fn build_headers(
    hdrs: &mut Vec<libc::mmsghdr>,
    addrs: &mut [libc::sockaddr_storage],
    iovs: &mut [libc::iovec],
    namelens: &[libc::socklen_t],
) {
    hdrs.clear();
    for ((addr, iov), &namelen) in addrs.iter_mut().zip(iovs.iter_mut()).zip(namelens) {
        // SAFETY: mmsghdr is plain old data; all-zero is valid.
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        h.msg_hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
        h.msg_hdr.msg_namelen = namelen;
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        hdrs.push(h);
    }
}

fn to_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid, and it
    // is large and aligned enough for either address family.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin) };
            (s, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin6) };
            (s, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

fn from_storage(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 for AF_INET6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    /// A batch sent with one `sendmmsg` arrives whole and in order through
    /// one `recvmmsg`, with each datagram's source; IPv4 and IPv6.
    #[test]
    fn a_batch_goes_out_and_comes_in_in_order() {
        for (a, b) in [("127.0.0.1:0", "127.0.0.1:0"), ("[::1]:0", "[::1]:0")] {
            let (Ok(tx), Ok(rx)) = (UdpSocket::bind(a), UdpSocket::bind(b)) else {
                continue; // no IPv6 here
            };
            rx.set_nonblocking(true).unwrap();
            let to = rx.local_addr().unwrap();
            let mut q = SendQueue::new(64);
            for i in 0..40u8 {
                assert_eq!(q.push(&tx, to, &vec![i; 1 + i as usize * 30]), Flushed::default());
            }
            assert_eq!(q.len(), 40);
            assert_eq!(q.flush(&tx), Flushed { sent: 40, dropped: 0 });
            assert_eq!(q.len(), 0);
            let mut batch = RecvBatch::new(16, crate::header::MAX_DATAGRAM + 1);
            let mut got = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while got.len() < 40 {
                assert!(std::time::Instant::now() < deadline, "datagrams lost on loopback");
                let n = batch.recv(&rx).unwrap_or(0);
                assert!(n <= 16, "a batch holds at most its size");
                for i in 0..n {
                    let (from, bytes) = batch.get(i).expect("whole, from an IP address");
                    assert_eq!(from, tx.local_addr().unwrap());
                    got.push(bytes.to_vec());
                }
            }
            for (i, d) in got.iter().enumerate() {
                assert_eq!(d, &vec![i as u8; 1 + i * 30], "datagram {i} in order, intact");
            }
            assert_eq!(batch.recv(&rx).unwrap(), 0, "nothing more");
        }
    }

    /// A full queue flushes by itself before taking the next datagram.
    #[test]
    fn a_full_queue_flushes_first() {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut q = SendQueue::new(3);
        for _ in 0..3 {
            assert_eq!(q.push(&tx, to, b"x"), Flushed::default());
        }
        assert_eq!(q.push(&tx, to, b"y"), Flushed { sent: 3, dropped: 0 });
        assert_eq!(q.len(), 1);
    }
}
