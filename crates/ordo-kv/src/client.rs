//! A small blocking RESP client (tests, the kill test's history recorder,
//! `ordo bench kv`): one connection, pipelining by `send` then `recv`.

use crate::resp;
use crate::state::Reply;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One connection to a RESP server.
pub struct Client {
    stream: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
}

impl Client {
    /// Connects (and authenticates with `password`, if given); every read
    /// and write times out after `timeout`.
    pub fn connect(addr: SocketAddr, password: Option<&[u8]>, timeout: Duration) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut c = Client { stream, inbuf: Vec::new(), out: Vec::new() };
        if let Some(p) = password {
            match c.call(&[b"AUTH", p])? {
                Reply::Ok => {}
                other => return Err(std::io::Error::other(format!("AUTH refused: {other:?}"))),
            }
        }
        Ok(c)
    }

    /// Queues one command (sent by the next [`flush`](Self::flush) or
    /// [`recv`](Self::recv)).
    pub fn send(&mut self, args: &[&[u8]]) {
        let owned: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        resp::encode_request(&owned, &mut self.out);
    }

    /// Writes what is queued.
    pub fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// The next reply.
    pub fn recv(&mut self) -> std::io::Result<Reply> {
        self.flush()?;
        let mut buf = [0u8; 16 * 1024];
        loop {
            match resp::next_reply(&self.inbuf) {
                Ok(Some((reply, used))) => {
                    self.inbuf.drain(..used);
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())),
            }
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            self.inbuf.extend_from_slice(&buf[..n]);
        }
    }

    /// Sends one command and waits for its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.send(args);
        self.recv()
    }

    /// Writes raw bytes (tests of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.flush()?;
        self.stream.write_all(bytes)
    }
}
