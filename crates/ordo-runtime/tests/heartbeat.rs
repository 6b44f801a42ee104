//! End to end: configs → shm fabrics → SST heartbeat agents under runners;
//! members see each other's heartbeats, and a member that stops is
//! suspected by the others.

use ordo_fabric::FabricEvent;
use ordo_runtime::{HeartbeatAgent, OrdoConfig, Runner, connect_fabric};
use std::time::Duration;

fn config(cluster: &str, id: u32) -> OrdoConfig {
    let sets = [
        format!("member.id={id}"),
        "group.members=[0, 1, 2]".to_string(),
        format!("fabric.shm.cluster=\"{cluster}\""),
        "fabric.region_bytes=4096".to_string(),
        "fabric.shm.liveness_check_us=200".to_string(),
        "runtime.threading=\"shared\"".to_string(),
        "runtime.idle.park_max_us=500".to_string(),
    ];
    OrdoConfig::load(None, std::iter::empty(), &sets).expect("valid config")
}

#[test]
fn heartbeats_flow_and_a_stopped_member_is_suspected() {
    let cluster = format!("hb-{}", std::process::id());
    let handles: Vec<_> = (0..3)
        .map(|id| {
            let c = config(&cluster, id);
            std::thread::spawn(move || {
                let f = connect_fabric(&c).expect("fabric up");
                HeartbeatAgent::new(f, &c.group.members, 1_000_000).expect("sst fits")
            })
        })
        .collect();
    let mut agents: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let third = agents.pop().unwrap();
    let options = config(&cluster, 0).runner_options();
    let pair = Runner::start(agents, &options).unwrap();
    let single = Runner::start(vec![third], &options).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let third = single.join().agents.pop().unwrap();
    // While all three ran, everyone's heartbeats reached everyone.
    for (m, beat, suspected) in third.heartbeats() {
        assert!(beat >= 5, "member 2 saw only {beat} heartbeats from {m}");
        assert!(!suspected);
    }
    drop(third); // member 2 stops: its liveness lock goes away
    // Suspicion takes one liveness check (200 µs) after the next heartbeat
    // (1 ms); half a second is ample even on a loaded 2-core machine.
    std::thread::sleep(Duration::from_millis(500));
    let agents = pair.join().agents;
    for a in &agents {
        let suspected: Vec<_> = a.heartbeats().into_iter().filter(|h| h.2).map(|h| h.0).collect();
        assert_eq!(suspected, vec![2], "exactly member 2 suspected");
        assert!(a.log.iter().any(|(_, e)| matches!(e, FabricEvent::Suspected { peer: 2, .. })));
    }
}
