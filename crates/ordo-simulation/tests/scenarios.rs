//! Scenario scripts: every file under `testdata/raft`, `testdata/acuerdo`
//! and `testdata/vsync` (at the repository root) is run by that engine's
//! driver (`ordo_simulation::scenario`), one fresh cluster per file; each
//! command's output must match the text below its `----`. Rewrite the
//! expectations after an intended change with
//! `REWRITE=1 cargo test -p ordo-simulation --test scenarios`.

use ordo_simulation::scenario::acuerdo::AcuerdoCluster;
use ordo_simulation::scenario::raft::RaftCluster;
use ordo_simulation::scenario::vsync::VsyncCluster;
use std::path::Path;

fn testdata(engine: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(engine);
    let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert!(files > 0, "no scenario scripts under {}", dir.display());
    dir.to_str().expect("a UTF-8 path").to_string()
}

fn outcome(result: Result<String, String>) -> String {
    result.unwrap_or_else(|e| format!("error: {e}\n"))
}

#[test]
fn raft_scenarios() {
    datadriven::walk(&testdata("raft"), |f| {
        let mut cluster = RaftCluster::default();
        f.run(|tc| outcome(cluster.handle(&tc.directive, &tc.args, &tc.input)));
    });
}

#[test]
fn acuerdo_scenarios() {
    datadriven::walk(&testdata("acuerdo"), |f| {
        let mut cluster = AcuerdoCluster::default();
        f.run(|tc| outcome(cluster.handle(&tc.directive, &tc.args, &tc.input)));
    });
}

#[test]
fn vsync_scenarios() {
    datadriven::walk(&testdata("vsync"), |f| {
        let mut cluster = VsyncCluster::default();
        f.run(|tc| outcome(cluster.handle(&tc.directive, &tc.args, &tc.input)));
    });
}
