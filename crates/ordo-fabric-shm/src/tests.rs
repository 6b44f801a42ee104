use super::*;
use ordo_fabric::conformance::{self, Harness, Part};
use std::sync::atomic::AtomicUsize;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh cluster name per group, so concurrent tests never share files.
pub(crate) fn unique_cluster(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Creates `n` members (ids 0..n) concurrently; each waits for the others.
pub(crate) fn group(cluster: &str, n: usize, region_len: usize) -> Vec<ShmFabric> {
    let members: Vec<MemberId> = (0..n as MemberId).collect();
    let handles: Vec<_> = members
        .iter()
        .map(|&m| {
            let opts = ShmOptions::new(cluster, m, members.clone(), region_len);
            std::thread::spawn(move || ShmFabric::create(opts).expect("create member"))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

struct ShmHarness {
    last: Option<(String, usize, usize)>,
}

impl Harness for ShmHarness {
    type Fabric = ShmFabric;

    fn group(&mut self, n: usize, region_len: usize) -> Vec<ShmFabric> {
        let cluster = unique_cluster("conf");
        let len = region_len.next_multiple_of(64);
        self.last = Some((cluster.clone(), n, len));
        group(&cluster, n, len)
    }

    fn restart(&mut self, member: MemberId) -> Option<ShmFabric> {
        let (cluster, n, len) = self.last.clone()?;
        let members: Vec<MemberId> = (0..n as MemberId).collect();
        Some(ShmFabric::create(ShmOptions::new(cluster, member, members, len)).expect("restart"))
    }

    fn run(
        &mut self,
        members: Vec<ShmFabric>,
        parts: Vec<Part<ShmFabric>>,
        limit: Duration,
    ) -> Vec<ShmFabric> {
        conformance::run_on_threads(members, parts, limit)
    }

    fn has_doorbell(&self) -> bool {
        true
    }
}

#[test]
fn conformance_suite() {
    conformance::run_all(&mut ShmHarness { last: None });
}

#[test]
fn files_are_removed_on_drop() {
    let cluster = unique_cluster("drop");
    let g = group(&cluster, 2, 4096);
    let path = g[0].options().path_of(0);
    assert!(path.exists());
    drop(g);
    assert!(!path.exists());
}

#[test]
fn a_second_owner_of_a_live_member_is_refused() {
    let cluster = unique_cluster("dup");
    let g = group(&cluster, 1, 4096);
    let err = ShmFabric::create(ShmOptions::new(&cluster, 0, vec![0], 4096)).err().expect("refused");
    assert!(matches!(err, ShmError::AlreadyRunning { member: 0, .. }), "{err}");
    drop(g);
}

#[test]
fn bad_options_are_refused() {
    let cluster = unique_cluster("bad");
    let e = ShmFabric::create(ShmOptions::new(&cluster, 3, vec![0, 1], 4096)).err().unwrap();
    assert!(matches!(e, ShmError::BadOptions(_)), "{e}");
    let e = ShmFabric::create(ShmOptions::new(&cluster, 0, vec![0], 100)).err().unwrap();
    assert!(matches!(e, ShmError::BadOptions(_)), "{e}");
}

#[test]
fn a_missing_peer_times_out_with_a_clear_error() {
    let cluster = unique_cluster("missing");
    let mut opts = ShmOptions::new(&cluster, 0, vec![0, 1], 4096);
    opts.open_timeout = Duration::from_millis(50);
    let e = ShmFabric::create(opts).err().unwrap();
    assert!(matches!(e, ShmError::PeerNotReady { member: 1, .. }), "{e}");
    assert!(!region_path(Path::new("/dev/shm"), &cluster, 0).exists(), "own file removed on failure");
}

#[test]
fn a_peer_with_another_region_size_is_not_connected() {
    let cluster = unique_cluster("size");
    let a = std::thread::spawn({
        let c = cluster.clone();
        move || {
            let mut o = ShmOptions::new(&c, 0, vec![0, 1], 4096);
            o.open_timeout = Duration::from_millis(300);
            ShmFabric::create(o).err().map(|e| e.to_string())
        }
    });
    let mut o = ShmOptions::new(&cluster, 1, vec![0, 1], 8192);
    o.open_timeout = Duration::from_millis(800);
    let b = ShmFabric::create(o).err().map(|e| e.to_string());
    let a = a.join().unwrap();
    assert!(a.unwrap().contains("expected"), "member 0 must refuse the 8192-byte peer");
    assert!(b.is_some());
}

#[test]
fn restart_gets_a_new_incarnation_and_reconnect_finds_it() {
    let cluster = unique_cluster("restart");
    let mut g = group(&cluster, 2, 4096);
    let old = g.pop().unwrap();
    let old_incarnation = old.incarnation();
    drop(old);
    let mut events = Vec::new();
    let start = Instant::now();
    while !g[0].is_suspected(1) {
        g[0].poll_events(&mut events);
        assert!(start.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(g[0].reconnect(1), Err(ReconnectError::Unreachable(1, _))));
    let new = ShmFabric::create(ShmOptions::new(&cluster, 1, vec![0, 1], 4096)).unwrap();
    assert_ne!(new.incarnation(), old_incarnation);
    let inc = g[0].reconnect(1).expect("reconnects to the new incarnation");
    assert_eq!(inc, new.incarnation());
    g[0].region().store_release(0, 5);
    g[0].post_write(Write::new(1, 0, 8)).unwrap();
    assert_eq!(new.region().load_acquire(0), 5);
    g[0].poll_events(&mut events);
    assert!(events.contains(&FabricEvent::Reconnected { peer: 1, incarnation: inc }));
}

#[test]
fn members_sharing_a_doorbell_owner_park_on_one_bell() {
    let cluster = unique_cluster("bell");
    let members = vec![0, 1, 2];
    let handles: Vec<_> = members
        .iter()
        .map(|&m| {
            let mut o = ShmOptions::new(&cluster, m, members.clone(), 4096);
            // Members 1 and 2 are "driven by one thread": both park on 1's bell.
            if m == 2 {
                o.doorbell_owner = Some(1);
            }
            std::thread::spawn(move || ShmFabric::create(o).unwrap())
        })
        .collect();
    let mut g: Vec<ShmFabric> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(g[1].doorbell().unwrap().ptr_eq(g[2].doorbell().unwrap()));
    assert!(!g[0].doorbell().unwrap().ptr_eq(g[1].doorbell().unwrap()));
    // A write to member 2 rings the bell member 1 parks on.
    let bell = g[1].doorbell().unwrap().clone();
    let token = bell.prepare_park();
    let before = bell.seq();
    g[0].region().store_release(0, 1);
    g[0].post_write(Write::new(2, 0, 8)).unwrap();
    assert_eq!(bell.seq(), before + 1, "the write to 2 rang 1's bell");
    assert!(bell.park(token, Duration::from_secs(5)));
    drop(g.pop());
}
