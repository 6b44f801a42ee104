//! Reconnection: a member's fabric is dropped and recreated with the same id
//! and address; the survivor suspects it, then `reconnect` brings the link
//! back to the new incarnation and writes flow both ways again.

mod common;

use common::{wait_for_event, wait_until};
use ordo_fabric::{Fabric, FabricEvent, FailureCause, MemberId, PostError, ReconnectError, Write, WriteTag};
use ordo_fabric_tcp::TcpFabric;
use std::net::SocketAddr;
use std::time::Duration;

const REGION: usize = 4096;
const LIMIT: Duration = Duration::from_secs(10);

/// Recreates member `id` at `addr` (same id, same address), peer `other` at `other_addr`.
fn restart(id: MemberId, addr: SocketAddr, other: MemberId, other_addr: SocketAddr) -> TcpFabric {
    let mut o = common::options(id, REGION);
    o.listen = addr;
    o.peers = vec![(other, other_addr)];
    TcpFabric::connect(o).expect("the restarted member connects")
}

/// `survivor` sees `victim_id` go, reconnects to `restarted`, and both
/// directions work again.
fn check_recovery(
    survivor: &mut TcpFabric,
    victim_id: MemberId,
    mut restart_victim: impl FnMut() -> TcpFabric,
) {
    let survivor_id = survivor.member();
    let events = wait_for_event(survivor, LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));
    assert_eq!(events, vec![FabricEvent::Suspected { peer: victim_id, cause: FailureCause::ConnectionLost }]);
    assert!(survivor.is_suspected(victim_id));
    assert_eq!(survivor.post_write(Write::new(victim_id, 0, 8)), Err(PostError::PeerSuspected(victim_id)));
    assert!(matches!(survivor.reconnect(victim_id), Err(ReconnectError::Unreachable(..))));

    let mut victim = restart_victim();
    let mut result = Err(ReconnectError::UnknownPeer(victim_id));
    wait_until(LIMIT, "reconnect to succeed", || {
        result = survivor.reconnect(victim_id);
        result.is_ok()
    });
    assert_eq!(result, Ok(victim.incarnation()));
    assert!(!survivor.is_suspected(victim_id));
    let events = wait_for_event(survivor, LIMIT, |_| true);
    assert_eq!(events, vec![FabricEvent::Reconnected { peer: victim_id, incarnation: victim.incarnation() }]);
    // Reconnecting an up link is a no-op.
    assert_eq!(survivor.reconnect(victim_id), Ok(victim.incarnation()));

    survivor.region().store_release(256, 0xABCD);
    survivor.post_write(Write::signaled(victim_id, 256, 8, WriteTag(9))).unwrap();
    let events = wait_for_event(survivor, LIMIT, |_| true);
    assert_eq!(events, vec![FabricEvent::Completed { peer: victim_id, tag: WriteTag(9) }]);
    assert_eq!(victim.region().load_acquire(256), 0xABCD);

    victim.region().store_release(512, 0xDCBA);
    victim.post_write(Write::signaled(survivor_id, 512, 8, WriteTag(10))).unwrap();
    let events = wait_for_event(&mut victim, LIMIT, |_| true);
    assert_eq!(events, vec![FabricEvent::Completed { peer: survivor_id, tag: WriteTag(10) }]);
    assert_eq!(survivor.region().load_acquire(512), 0xDCBA);
}

#[test]
fn the_accepting_member_restarts() {
    let mut g = common::group(2, REGION, |_| {});
    let victim = g.pop().unwrap();
    let mut survivor = g.pop().unwrap();
    let (victim_addr, survivor_addr, old) =
        (victim.local_addr(), survivor.local_addr(), victim.incarnation());
    drop(victim);
    check_recovery(&mut survivor, 1, || {
        let f = restart(1, victim_addr, 0, survivor_addr);
        assert_ne!(f.incarnation(), old);
        f
    });
    assert_eq!(survivor.reconnect(7), Err(ReconnectError::UnknownPeer(7)));
}

#[test]
fn the_dialing_member_restarts() {
    let mut g = common::group(2, REGION, |_| {});
    let mut survivor = g.pop().unwrap();
    let victim = g.pop().unwrap();
    let (victim_addr, survivor_addr) = (victim.local_addr(), survivor.local_addr());
    drop(victim);
    check_recovery(&mut survivor, 0, || restart(0, victim_addr, 1, survivor_addr));
}

#[test]
fn writes_queued_for_a_dead_link_are_not_applied_later() {
    // Member 0 streams increasing values of one word to member 1 and never
    // waits; member 1 restarts. Whatever the new incarnation sees must come
    // from writes posted after the reconnect (they start at 1000000).
    let mut g = common::group(2, REGION, |_| {});
    let victim = g.pop().unwrap();
    let mut survivor = g.pop().unwrap();
    let (victim_addr, survivor_addr) = (victim.local_addr(), survivor.local_addr());
    let streamer = std::thread::spawn(move || {
        let mut v = 1u64;
        let mut events = Vec::new();
        loop {
            survivor.region().store_release(0, v);
            match survivor.post_write(Write::new(1, 0, 8)) {
                Ok(()) | Err(PostError::Backpressure(_)) => v += 1,
                Err(PostError::PeerSuspected(_)) => break,
                Err(e) => panic!("{e}"),
            }
            survivor.poll_events(&mut events);
        }
        survivor
    });
    std::thread::sleep(Duration::from_millis(20));
    drop(victim);
    // The streamer stopped on PeerSuspected (its polls took the event).
    let mut survivor = streamer.join().unwrap();
    assert!(survivor.is_suspected(1));
    let victim = restart(1, victim_addr, 0, survivor_addr);
    wait_until(LIMIT, "reconnect", || survivor.reconnect(1).is_ok());
    // Give any stale bytes every chance to show up.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        victim.region().load_acquire(0),
        0,
        "a write posted to the dead link reached the new incarnation"
    );
    survivor.region().store_release(0, 1_000_000);
    survivor.post_write(Write::new(1, 0, 8)).unwrap();
    wait_until(LIMIT, "the new write", || victim.region().load_acquire(0) == 1_000_000);
}
