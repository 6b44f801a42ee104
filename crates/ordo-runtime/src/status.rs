//! The member daemon's HTTP status endpoint: `GET /metrics` (Prometheus
//! text exposition format) and `GET /status` (JSON, [`NodeStatus`]).
//!
//! # Invariants
//! - Read-only: no request changes the member.
//! - Bounded: a request head of at most [`MAX_REQUEST`] bytes, read within
//!   one second; one request per connection; requests are served one at a
//!   time on one thread. Anything else gets `400`, `404` or `405` and the
//!   connection closes.

use crate::node::NodeStatus;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest request head read.
pub const MAX_REQUEST: usize = 8 * 1024;

/// A running status endpoint.
pub struct StatusServer {
    addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatusServer {
    /// Serves `source()` on `addr`.
    pub fn start(
        addr: SocketAddr,
        source: impl Fn() -> NodeStatus + Send + Sync + 'static,
    ) -> std::io::Result<StatusServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new().name("status".into()).spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => serve(stream, &source),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })?;
        Ok(StatusServer { addr, shutdown, thread: Some(thread) })
    }

    /// The address it serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut stream: TcpStream, source: &impl Fn() -> NodeStatus) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > MAX_REQUEST {
            return respond(&mut stream, "400 Bad Request", "text/plain", "request too large\n");
        }
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut stream, "405 Method Not Allowed", "text/plain", "GET only\n");
    }
    match path {
        "/metrics" => respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &metrics_text(&source())),
        "/status" => {
            let body =
                serde_json::to_string_pretty(&source()).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            respond(&mut stream, "200 OK", "application/json", &(body + "\n"))
        }
        _ => respond(&mut stream, "404 Not Found", "text/plain", "try /metrics or /status\n"),
    }
}

fn respond(stream: &mut TcpStream, status: &str, kind: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The status in the Prometheus text format.
pub fn metrics_text(s: &NodeStatus) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let m = s.member;
    let mut metric = |name: &str, kind: &str, help: &str, rows: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{{member=\"{m}\"{labels}}} {v}");
        }
    };
    let one = |v: f64| vec![(String::new(), v)];
    metric("ordo_view_id", "gauge", "The installed view's number.", &one(s.view as f64));
    metric("ordo_view_members", "gauge", "Members of the installed view.", &one(s.members.len() as f64));
    metric(
        "ordo_view_changing",
        "gauge",
        "1 while a view change is under way.",
        &one(f64::from(u8::from(s.state == "changing"))),
    );
    metric(
        "ordo_running",
        "gauge",
        "1 while the member takes part in the group.",
        &one(f64::from(u8::from(s.state == "running" || s.state == "changing"))),
    );
    metric("ordo_view_changes_total", "counter", "Views installed since start.", &one(s.view_changes as f64));
    metric(
        "ordo_view_change_seconds_sum",
        "counter",
        "Wedge-to-install time of every view change, summed.",
        &one(s.view_change_seconds_sum),
    );
    metric(
        "ordo_view_change_last_seconds",
        "gauge",
        "Wedge-to-install time of the last view change.",
        &one(s.last_view_change_ms / 1e3),
    );
    metric("ordo_suspicions_total", "counter", "Peers suspected by the fabric.", &one(s.suspicions as f64));
    metric(
        "ordo_ragged_delivered_total",
        "counter",
        "Messages delivered in ragged-edge cleanups.",
        &one(s.ragged_delivered as f64),
    );
    metric("ordo_resent_total", "counter", "Own messages resent in a new view.", &one(s.resent as f64));
    let per = |f: &dyn Fn(&crate::node::SubgroupStatus) -> f64| -> Vec<(String, f64)> {
        s.subgroups.iter().map(|g| (format!(",subgroup=\"{}\"", g.subgroup), f(g))).collect()
    };
    metric(
        "ordo_delivered_messages_total",
        "counter",
        "Application messages delivered.",
        &per(&|g| g.delivered_messages as f64),
    );
    metric("ordo_delivered_bytes_total", "counter", "Bytes delivered.", &per(&|g| g.delivered_bytes as f64));
    metric(
        "ordo_sent_messages_total",
        "counter",
        "Messages the load generator sent.",
        &per(&|g| g.sent_messages as f64),
    );
    metric(
        "ordo_nulls_sent",
        "gauge",
        "Null rounds sent in the current view.",
        &per(&|g| g.nulls_sent as f64),
    );
    metric(
        "ordo_delivery_batch_mean",
        "gauge",
        "Mean messages per delivery batch in the current view.",
        &per(&|g| g.mean_batch),
    );
    let c = |i: usize| s.control[i] as f64;
    metric(
        "ordo_control_frames_total",
        "counter",
        "Control-plane frames, by direction and outcome.",
        &[
            (",kind=\"in\"".into(), c(0)),
            (",kind=\"out\"".into(), c(1)),
            (",kind=\"refused\"".into(), c(2)),
            (",kind=\"dropped\"".into(), c(3)),
        ],
    );
    metric("ordo_uptime_seconds", "gauge", "Seconds since start.", &one(s.uptime_s));
    out
}
