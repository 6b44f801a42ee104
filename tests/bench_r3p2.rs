//! `ordo bench r3p2`'s compared pairs run end to end with real server
//! processes: `lightp99` (the unreplicated server and 3 replicas on fresh
//! clusters, interleaved, parked and busy-polling) and `calls` (blocking
//! `Client::call`, the client spinning first against yielding first). At a
//! high "light" rate so the test is short; the figures themselves are not
//! asserted (this machine is shared with the other tests), only that
//! every pair was measured over its rounds, its differences agree with its
//! two sides, and some round was clean.

use std::process::Command;

#[test]
fn lightp99_and_calls_measure_every_round_of_their_pairs() {
    let out_dir = std::env::temp_dir().join(format!("ordo-bench-r3p2-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["bench", "r3p2", "--quick", "--json", "--figures", "lightp99,calls", "--start-rps", "5000"])
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("ordo bench r3p2 runs");
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(
        out.status.success(),
        "ordo bench r3p2 failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    let mut clean_rounds = 0;
    for (figure, names) in [
        ("light_overhead", ["light-load p99", "light-load p50", "light-load p99", "light-load p50"]),
        ("calls", ["Client::call p50", "Client::call p99", "Client::call p50", "Client::call p99"]),
    ] {
        let pairs = report[figure].as_array().unwrap_or_else(|| panic!("{figure}: {report}"));
        assert_eq!(pairs.len(), names.len(), "{figure}: two modes or configurations × p50 and p99");
        for (pair, name) in pairs.iter().zip(names) {
            let text = pair["name"].as_str().unwrap();
            assert!(text.starts_with(name), "{text}");
            let rounds = pair["rounds"].as_u64().unwrap();
            assert!(rounds >= 3, "{text}: {rounds} rounds");
            let clean = pair["difference"]["n"].as_u64().unwrap_or(0);
            clean_rounds += clean;
            if clean > 0 {
                // Each round's difference pairs one sample of each side, so
                // the differences lie within what the sides' ranges allow,
                // and the sides' values are latencies.
                let (d, r, s) = (&pair["difference"], &pair["reference_spread"], &pair["subject_spread"]);
                let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
                assert!(f(r, "min") > 0.0 && f(s, "min") > 0.0, "{text}: {pair}");
                let slack = 1e-6;
                assert!(f(d, "min") >= f(s, "min") - f(r, "max") - slack, "{text}: {pair}");
                assert!(f(d, "max") <= f(s, "max") - f(r, "min") + slack, "{text}: {pair}");
            }
        }
    }
    // The test binary runs alone: a run whose every round was contended
    // (or never kept up) would say the pairing or the probe is broken.
    assert!(clean_rounds > 0, "not one clean round: {report}");
    // Each lightp99 point is in the rows: 2 modes × 3 rounds × 2 sides, at
    // least (a contended point is measured again), each with answers.
    let rows: Vec<&serde_json::Value> =
        report["rows"].as_array().unwrap().iter().filter(|r| r["figure"] == "lightp99").collect();
    assert!(rows.len() >= 12, "{} lightp99 points", rows.len());
    for r in rows {
        assert!(r["achieved_rps"].as_f64().unwrap() > 0.0, "a point answered nothing: {r}");
    }
}
