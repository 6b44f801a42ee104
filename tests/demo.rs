//! The main job works: `ordo demo` starts a 3-member group of processes on
//! the shm fabric, streams for a second, and every member delivers every
//! message (it exits non-zero otherwise). Run with Spindle on and off.

use std::process::Command;

fn run_demo(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["demo", "--seconds", "1", "--size", "1024", "--window", "16"])
        .args(extra)
        .output()
        .expect("ordo demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "ordo demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn check(stdout: &str) {
    assert!(stdout.contains("delivered at every member: all"), "{stdout}");
    // One row per member, each with a non-zero delivered rate.
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with(['0', '1', '2'])).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    for r in rows {
        let gbs: f64 = r.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(gbs > 0.0, "member delivered nothing: {r}");
    }
}

#[test]
fn demo_delivers_every_message_at_every_member() {
    check(&run_demo(&[]));
}

#[test]
fn demo_baseline_delivers_every_message_at_every_member() {
    check(&run_demo(&["--baseline"]));
}

/// Zero-copy across processes: each member reads the others' rings in
/// their shm mappings; every member still delivers every message (the demo
/// checks counts; the in-process tests check order and payloads).
#[test]
fn demo_zero_copy_delivers_every_message_at_every_member() {
    let out = run_demo(&["--zero-copy"]);
    check(&out);
    assert!(out.contains("zero-copy) at 3 of 3 members"), "{out}");
    assert!(run_demo(&[]).contains("zero-copy) at 0 of 3 members"), "copy is the default");
}

/// `ordo demo --kill` (and on tcp): the view leader is SIGKILLed halfway;
/// the survivors install view 1 and the demo checks (exiting non-zero
/// otherwise) that they delivered the same messages, and that what the
/// killed leader delivered is a prefix of that.
#[test]
fn demo_kill_shows_the_view_change_and_agreement() {
    let fabrics: &[&str] = if cfg!(feature = "ofi") { &["shm", "tcp", "ofi"] } else { &["shm", "tcp"] };
    for &fabric in fabrics {
        let out = run_demo(&["--kill", "--rate", "4000", "--fabric", fabric]);
        assert!(out.contains("SIGKILL member 0"), "{out}");
        assert!(out.contains("view 1 [1, 2] installed"), "{out}");
        assert!(out.contains("failure atomicity"), "{out}");
        assert!(!out.contains("DIFFERENTLY"), "{out}");
    }
}
