//! The daemon's control plane: view-change messages travel between members
//! sealed with the cluster secret. A stranger — without the secret, with
//! another one, replaying a captured frame, lying about a length or
//! claiming an unknown member id — is refused: nothing reaches the member,
//! the refusal is counted, and real traffic keeps flowing.

use ordo_auth::Sealer;
use ordo_runtime::control::{LABEL, MAX_FRAME};
use ordo_runtime::{ControlPlane, Secret};
use ordo_vsync::view::{Ballot, ControlMsg};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// A frame as member `from` would send it to member `to`, sealed with
/// `secret` (or not sealed).
fn frame(from: u32, to: u32, msg: &ControlMsg, secret: Option<&Secret>) -> Vec<u8> {
    let mut body = from.to_be_bytes().to_vec();
    msg.encode(&mut body);
    if let Some(s) = secret {
        Sealer::new(s.derive(LABEL)).seal(&mut body, now_ns(), &to.to_be_bytes());
    }
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn recv(cp: &ControlPlane, within: Duration) -> Option<(u32, ControlMsg)> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(m) = cp.try_recv() {
            return Some(m);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn send_raw(addr: SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.write_all(bytes);
    // Give the reader a moment to refuse and close.
    std::thread::sleep(Duration::from_millis(50));
}

fn wait_refused(cp: &ControlPlane, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while cp.stats().refused.load(Ordering::Relaxed) < at_least {
        assert!(Instant::now() < deadline, "refusal not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn members_with_the_secret_talk_and_strangers_are_refused() {
    let secret = Secret::generate();
    let (a0, a1) = (free_addr(), free_addr());
    let members = [(0, a0), (1, a1)];
    let m0 = ControlPlane::start(0, a0, &members, Some(&secret)).unwrap();
    let m1 = ControlPlane::start(1, a1, &members, Some(&secret)).unwrap();
    let hb = ControlMsg::Heartbeat { view: 7 };
    m1.send(0, hb.clone());
    assert_eq!(recv(&m0, Duration::from_secs(5)), Some((1, hb.clone())), "a member's frame arrives");

    let forged = ControlMsg::Prepare { view: 7, ballot: Ballot { round: 1 << 40, leader: 1 } };
    // Unsealed.
    send_raw(a0, &frame(1, 0, &forged, None));
    wait_refused(&m0, 1);
    // Sealed with another secret.
    send_raw(a0, &frame(1, 0, &forged, Some(&Secret::generate())));
    wait_refused(&m0, 2);
    // Sealed for member 1, sent to member 0.
    send_raw(a0, &frame(1, 1, &forged, Some(&secret)));
    wait_refused(&m0, 3);
    // An unknown member id.
    send_raw(a0, &frame(9, 0, &forged, Some(&secret)));
    wait_refused(&m0, 4);
    // A length beyond the bound, and one too short.
    send_raw(a0, &((MAX_FRAME as u32 + 1).to_be_bytes()));
    wait_refused(&m0, 5);
    send_raw(a0, &[0, 0, 0, 1, 0]);
    wait_refused(&m0, 6);
    // A captured genuine frame, replayed on a new connection.
    let genuine = frame(1, 0, &hb, Some(&secret));
    send_raw(a0, &genuine);
    assert_eq!(recv(&m0, Duration::from_secs(5)), Some((1, hb.clone())), "the genuine frame arrives once");
    send_raw(a0, &genuine);
    wait_refused(&m0, 7);
    assert_eq!(recv(&m0, Duration::from_millis(200)), None, "nothing forged or replayed reached member 0");
    // Real traffic still flows.
    m1.send(0, ControlMsg::Installed { view: 7 });
    assert_eq!(recv(&m0, Duration::from_secs(5)), Some((1, ControlMsg::Installed { view: 7 })));
    assert_eq!(m0.stats().refused.load(Ordering::Relaxed), 7);
}
