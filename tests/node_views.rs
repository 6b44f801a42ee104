//! Virtual synchrony with real processes: `ordo cluster up` starts `ordo
//! node` daemons (one vsync member each, every member sending), members are
//! SIGKILLed under load, and the survivors' delivery logs are compared.
//!
//! - `kill_a_member_then_the_leader_{shm,tcp}`: 4 members; member 3 is
//!   killed, the other three install view 1 [0, 1, 2]; then the view
//!   leader (0) is killed and [1, 2] install view 2. Every completed view's
//!   survivors delivered exactly the same sequence; what a killed member
//!   delivered in its last view is a prefix of that (failure atomicity);
//!   the final view's sequences are prefixes of each other; no member
//!   delivers a message twice; each surviving sender's messages arrive
//!   without a gap (what the ragged trim cut was resent).
//! - `a_majority_goes_on_and_a_minority_stops`: 5 members; 2 killed at
//!   once, the 3 others go on (in view 1, or 2 when the second death came
//!   after the first change was decided); then 2 more killed, and the last
//!   one stops with a minority error instead of going on alone.
//!
//! Bounded: every wait has a deadline; `Drop` takes the cluster down.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Cluster {
    dir: PathBuf,
}

fn ordo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ordo")).args(args).output().expect("run ordo")
}

/// A base port whose fabric, control and status ports are free now.
fn free_base(n: u16) -> u16 {
    ordo_runtime::node::free_base_port(u32::from(n)).expect("free ports")
}

impl Cluster {
    fn up(name: &str, n: u16, fabric: &str) -> Cluster {
        Cluster::up_with(name, n, fabric, "vsync")
    }

    fn up_with(name: &str, n: u16, fabric: &str, engine: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("ordo-node-views-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let base = free_base(n).to_string();
        let out = ordo(&[
            "cluster",
            "up",
            "-n",
            &n.to_string(),
            "--fabric",
            fabric,
            "--dir",
            dir.to_str().unwrap(),
            "--base-port",
            &base,
            "--rate",
            "1500",
            "--size",
            "128",
            "--delivery-log",
            "--engine",
            engine,
        ]);
        let c = Cluster { dir };
        assert!(out.status.success(), "cluster up: {}{}", String::from_utf8_lossy(&out.stdout), c.logs());
        c
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for id in 0..8 {
            if let Ok(t) = std::fs::read_to_string(self.dir.join(format!("node-{id}.log"))) {
                let tail: Vec<&str> = t.lines().rev().take(12).collect();
                s += &format!(
                    "\n--- node {id} ---\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
        s
    }

    fn status(&self) -> Vec<Value> {
        let out = ordo(&["cluster", "status", "--json", "--dir", self.dir.to_str().unwrap()]);
        assert!(out.status.success(), "cluster status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("status --json is a JSON array")
    }

    fn kill(&self, member: u32) {
        let out = ordo(&["cluster", "kill", &member.to_string(), "--dir", self.dir.to_str().unwrap()]);
        assert!(out.status.success(), "cluster kill {member}");
    }

    /// Waits until every member in `members` runs view `view` with exactly
    /// those members.
    fn wait_view(&self, view: u64, members: &[u32]) {
        assert_eq!(self.wait_members(members), view, "the view number");
    }

    /// Waits until every member in `members` runs the same view, with
    /// exactly those members; returns its number. (Two kills close together
    /// may take two view changes: one decided before the second death.)
    fn wait_members(&self, members: &[u32]) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.status();
            let view = &st[members[0] as usize]["view"];
            let ok = members.iter().all(|&m| {
                let s = &st[m as usize];
                s["state"] == "running"
                    && s["view"] == *view
                    && s["members"].as_array().is_some_and(|a| {
                        a.iter().map(|x| x.as_u64().unwrap()).eq(members.iter().map(|&x| u64::from(x)))
                    })
            });
            if ok {
                return view.as_u64().expect("a view number");
            }
            assert!(Instant::now() < deadline, "no view {members:?} installed: {st:#?}{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every member in `members` delivered at least `more`
    /// messages beyond what it had.
    fn wait_progress(&self, members: &[u32], more: u64) {
        let delivered = |st: &[Value], m: u32| -> u64 {
            st[m as usize]["subgroups"]
                .as_array()
                .map_or(0, |a| a.iter().map(|g| g["delivered_messages"].as_u64().unwrap()).sum())
        };
        let st = self.status();
        let start: Vec<u64> = members.iter().map(|&m| delivered(&st, m)).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.status();
            if members.iter().zip(&start).all(|(&m, s)| delivered(&st, m) >= s + more) {
                return;
            }
            assert!(Instant::now() < deadline, "no progress: {st:#?}{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self, member: u32) -> Vec<Line> {
        read_log(&self.dir.join(format!("delivered-{member}.log")))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = ordo(&["cluster", "down", "--dir", self.dir.to_str().unwrap()]);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One delivery: (view, subgroup, sender, index, bytes, digest).
type Line = (u64, u64, u64, u64, u64, String);

fn read_log(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        // A member killed mid-write may leave a cut last line.
        if f.len() != 6 || f[5].len() != 16 {
            continue;
        }
        let n = |i: usize| f[i].parse::<u64>();
        if let (Ok(v), Ok(g), Ok(s), Ok(i), Ok(b)) = (n(0), n(1), n(2), n(3), n(4)) {
            out.push((v, g, s, i, b, f[5].to_string()));
        }
    }
    out
}

fn in_view(log: &[Line], v: u64) -> Vec<Line> {
    log.iter().filter(|l| l.0 == v).cloned().collect()
}

fn is_prefix(a: &[Line], b: &[Line]) -> bool {
    a.len() <= b.len() && a == &b[..a.len()]
}

/// No duplicates; each sender's messages in index order; for `gapless`
/// senders, no gap either.
fn check_fifo(member: u32, log: &[Line], gapless: &[u64]) {
    let mut next: BTreeMap<u64, u64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for l in log {
        assert!(seen.insert((l.2, l.3)), "member {member} delivered message {} of {} twice", l.3, l.2);
        let n = next.entry(l.2).or_insert(0);
        if gapless.contains(&l.2) {
            assert_eq!(l.3, *n, "member {member}: a gap in sender {}'s messages", l.2);
        } else {
            assert!(l.3 >= *n, "member {member}: sender {}'s messages out of order", l.2);
        }
        *n = l.3 + 1;
    }
}

fn kill_a_member_then_the_leader(fabric: &str) {
    let c = Cluster::up(&format!("leader-{fabric}"), 4, fabric);
    c.wait_progress(&[0, 1, 2, 3], 200);
    c.kill(3);
    c.wait_view(1, &[0, 1, 2]);
    c.wait_progress(&[0, 1, 2], 200);
    c.kill(0);
    c.wait_view(2, &[1, 2]);
    c.wait_progress(&[1, 2], 300);
    // Let the logs flush (every tick), then read them.
    std::thread::sleep(Duration::from_millis(200));
    let logs: Vec<Vec<Line>> = (0..4).map(|m| c.log(m)).collect();
    for (m, log) in logs.iter().enumerate() {
        assert!(!log.is_empty(), "member {m} logged deliveries");
    }
    // View 0 is complete: its survivors 0, 1, 2 delivered the same.
    let v0 = in_view(&logs[1], 0);
    assert!(!v0.is_empty());
    assert_eq!(in_view(&logs[0], 0), v0, "members 0 and 1 agree on view 0");
    assert_eq!(in_view(&logs[2], 0), v0, "members 2 and 1 agree on view 0");
    assert!(is_prefix(&in_view(&logs[3], 0), &v0), "what killed member 3 delivered, the survivors delivered");
    // View 1 is complete for 1 and 2; member 0 died in it.
    let v1 = in_view(&logs[1], 1);
    assert!(!v1.is_empty());
    assert_eq!(in_view(&logs[2], 1), v1, "members 1 and 2 agree on view 1");
    assert!(
        is_prefix(&in_view(&logs[0], 1), &v1),
        "what killed member 0 delivered in view 1, the survivors did"
    );
    assert!(in_view(&logs[3], 1).is_empty(), "a member killed in view 0 delivers nothing in view 1");
    // View 2 runs on: one member's sequence is a prefix of the other's.
    let (a, b) = (in_view(&logs[1], 2), in_view(&logs[2], 2));
    assert!(!a.is_empty() && !b.is_empty());
    assert!(is_prefix(&a, &b) || is_prefix(&b, &a), "members 1 and 2 agree on view 2 so far");
    // Members 1 and 2 survived throughout: their messages arrive without a
    // gap at each other (a message the trim cut was resent).
    for m in [1, 2] {
        check_fifo(m, &logs[m as usize], &[1, 2]);
    }
    for m in [0, 3] {
        check_fifo(m, &logs[m as usize], &[]);
    }
}

#[test]
fn kill_a_member_then_the_leader_shm() {
    kill_a_member_then_the_leader("shm");
}

#[test]
fn kill_a_member_then_the_leader_tcp() {
    kill_a_member_then_the_leader("tcp");
}

#[test]
fn a_majority_goes_on_and_a_minority_stops() {
    let c = Cluster::up("minority", 5, "shm");
    c.wait_progress(&[0, 1, 2, 3, 4], 100);
    c.kill(1);
    c.kill(3);
    let v = c.wait_members(&[0, 2, 4]);
    c.wait_progress(&[0, 2, 4], 100);
    c.kill(0);
    c.kill(2);
    // Member 4 is left alone of view v [0, 2, 4] (or of a view [2, 4] that
    // 2 and 4 installed between the two kills, which is a majority of v):
    // a minority. It must stop rather than go on alone.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(c.dir.join("node-4.log")).unwrap_or_default();
        if let Some(rest) = log.split("in a minority of view ").nth(1) {
            let stopped_in: u64 = rest.split(' ').next().unwrap().parse().unwrap();
            assert!(
                stopped_in == v || stopped_in == v + 1,
                "member 4 stopped in view {stopped_in}, after {v}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "member 4 did not stop in a minority{}", c.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = c.status();
    assert_ne!(st[4]["state"], "running", "the minority member no longer runs: {st:#?}");
    assert!(
        read_log(&c.dir.join("delivered-4.log")).iter().all(|l| l.0 <= v + 1),
        "no view after the minority"
    );
}

#[test]
fn a_member_leaves_gracefully_on_sigterm() {
    let c = Cluster::up("leave", 3, "shm");
    c.wait_progress(&[0, 1, 2], 100);
    let pids: Vec<i32> = std::fs::read_to_string(c.dir.join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    // SAFETY: a pid of a daemon this test started.
    assert_eq!(unsafe { libc::kill(pids[2], libc::SIGTERM) }, 0);
    c.wait_view(1, &[0, 1]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(c.dir.join("node-2.log")).unwrap_or_default().contains("left the group") {
        assert!(Instant::now() < deadline, "member 2 did not report leaving{}", c.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_progress(&[0, 1], 100);
    std::thread::sleep(Duration::from_millis(100));
    let (a, b) = (c.log(0), c.log(1));
    assert_eq!(in_view(&a, 0), in_view(&b, 0), "members 0 and 1 agree on view 0");
    assert!(is_prefix(&in_view(&c.log(2), 0), &in_view(&a, 0)), "what the leaver delivered, the others did");
}

#[test]
fn a_killed_member_restarts_rejoins_and_receives_its_state() {
    for fabric in ["shm", "tcp"] {
        let c = Cluster::up(&format!("rejoin-{fabric}"), 3, fabric);
        c.wait_progress(&[0, 1, 2], 200);
        c.kill(2);
        c.wait_view(1, &[0, 1]);
        c.wait_progress(&[0, 1], 200);
        let out = ordo(&["cluster", "restart", "2", "--dir", c.dir.to_str().unwrap()]);
        assert!(out.status.success(), "cluster restart: {}", String::from_utf8_lossy(&out.stderr));
        c.wait_view(2, &[0, 1, 2]);
        c.wait_progress(&[0, 1, 2], 300);
        std::thread::sleep(Duration::from_millis(100));
        let logs: Vec<Vec<Line>> = (0..3).map(|m| c.log(m)).collect();
        // Member 2 restored the group's history at its join: its counter
        // covers everything delivered in views 0 and 1, though its new
        // incarnation delivered only from view 2 on.
        let before: usize = logs[0].iter().filter(|l| l.0 < 2).count();
        assert_eq!(
            before,
            logs[1].iter().filter(|l| l.0 < 2).count(),
            "members 0 and 1 agree before the join"
        );
        let st = c.status();
        let delivered = |m: usize| -> u64 {
            st[m]["subgroups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["delivered_messages"].as_u64().unwrap())
                .sum()
        };
        let since: usize = read_log(&c.dir.join("delivered-2.log")).iter().filter(|l| l.0 >= 2).count();
        assert!(
            delivered(2) >= before as u64 && delivered(2) as usize >= since,
            "member 2's restored state counts the history: {} delivered, {before} before its join{}",
            delivered(2),
            c.logs()
        );
        // In view 2 all three deliver the same sequence (so far).
        let v2: Vec<Vec<Line>> = logs.iter().map(|l| in_view(l, 2)).collect();
        for m in 1..3 {
            assert!(
                is_prefix(&v2[m], &v2[0]) || is_prefix(&v2[0], &v2[m]),
                "members 0 and {m} agree on view 2"
            );
        }
        assert!(!v2[2].is_empty(), "the joiner delivers in view 2");
        for (m, log) in logs.iter().enumerate() {
            check_fifo(m as u32, log, &[]);
        }
    }
}

#[test]
fn acuerdo_daemons_survive_a_leader_kill_and_catch_up_a_restart() {
    for fabric in ["shm", "tcp"] {
        let c = Cluster::up_with(&format!("acuerdo-{fabric}"), 3, fabric, "acuerdo");
        c.wait_progress(&[0, 1, 2], 200);
        let leader = |st: &[Value]| st.iter().position(|s| s["state"] == "leader").map(|i| i as u32);
        let old = leader(&c.status()).expect("a leader");
        c.kill(old);
        let rest: Vec<u32> = (0..3).filter(|m| *m != old).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while leader(&c.status()).is_none_or(|l| l == old) {
            assert!(Instant::now() < deadline, "no new leader{}", c.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_progress(&rest, 200);
        // What the killed leader delivered (its log ends with its death).
        let dead: Vec<Line> = read_log(&c.dir.join(format!("delivered-{old}.log")));
        let out = ordo(&["cluster", "restart", &old.to_string(), "--dir", c.dir.to_str().unwrap()]);
        assert!(out.status.success(), "cluster restart: {}", String::from_utf8_lossy(&out.stderr));
        c.wait_progress(&[0, 1, 2], 200);
        std::thread::sleep(Duration::from_millis(100));
        // The survivors delivered the same sequence (one a prefix of the
        // other, as they run on); the killed leader's is a prefix of it.
        let (a, b) = (c.log(rest[0]), c.log(rest[1]));
        if !(is_prefix(&a, &b) || is_prefix(&b, &a)) {
            let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            let around = |l: &[Line]| l[at.saturating_sub(3)..(at + 3).min(l.len())].to_vec();
            panic!(
                "the survivors disagree at delivery {at} of {} / {}: {:?} vs {:?}{}",
                a.len(),
                b.len(),
                around(&a),
                around(&b),
                c.logs()
            );
        }
        let longest = if a.len() >= b.len() { &a } else { &b };
        assert!(
            is_prefix(&dead[..dead.len().min(longest.len())], longest),
            "the killed leader's deliveries are a prefix"
        );
        // The restarted member caught up: its counter covers the history.
        let st = c.status();
        let delivered = |m: u32| -> u64 {
            st[m as usize]["subgroups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["delivered_messages"].as_u64().unwrap())
                .sum()
        };
        assert!(
            delivered(old) + 500 >= delivered(rest[0]).min(delivered(rest[1])),
            "the restarted member caught up: {st:#?}"
        );
    }
}
