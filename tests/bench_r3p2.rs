//! `ordo bench r3p2`'s compared pairs run end to end with real server
//! processes: `lightp99` (the unreplicated server and 3 replicas on fresh
//! clusters, interleaved, parked and busy-polling) and `calls` (blocking
//! `Client::call`, the client spinning first against yielding first). At a
//! high "light" rate so the test is short; the figures themselves are not
//! asserted (this machine is shared with the other tests), only that
//! every round was measured and either enters the pair's differences or
//! is reported as contended.

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
            let contended = pair["contended_samples"].as_u64().unwrap();
            if figure == "calls" {
                // Every call is answered (a failed call fails the run), so
                // a round is left out only for contention.
                assert!(clean + contended >= rounds, "{text}: {pair}");
            }
            if clean > 0 {
                let d = &pair["difference"];
                let (lo, mid, hi) =
                    (d["min"].as_f64().unwrap(), d["median"].as_f64().unwrap(), d["max"].as_f64().unwrap());
                assert!(lo <= mid && mid <= hi && lo.is_finite() && hi.is_finite(), "{text}: {d}");
            }
        }
    }
    // Each lightp99 point is in the rows: 2 modes × 3 rounds × 2 sides, at
    // least (a contended point is measured again), each with answers.
    let rows: Vec<&serde_json::Value> =
        report["rows"].as_array().unwrap().iter().filter(|r| r["figure"] == "lightp99").collect();
    assert!(rows.len() >= 12, "{} lightp99 points", rows.len());
    for r in rows {
        assert!(r["achieved_rps"].as_f64().unwrap() > 0.0, "a point answered nothing: {r}");
    }
}
