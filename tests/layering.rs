//! Dependencies point down only (DESIGN.md §1). Reads `cargo metadata` and
//! fails if a crate depends on one of its own layer or above, if an engine,
//! the SST, the rings or the simulator depend on the runtime or a real
//! fabric backend (even as a dev-dependency, for all but the simulator's
//! users), or if a new `ordo-*` crate has not been given a layer here.

use std::collections::BTreeMap;
use std::process::Command;

/// (crate, layer). Lower layers may not depend on higher ones.
const LAYERS: &[(&str, u32)] = &[
    ("ordo-fault", 0),
    ("ordo-fabric", 1),
    ("ordo-sst", 2),
    ("ordo-ring", 3),
    ("ordo-fabric-shm", 2),
    ("ordo-fabric-tcp", 2),
    ("ordo-sim", 4),
    ("ordo-vsync", 5),
    ("ordo-acuerdo", 5),
    ("ordo-raft", 5),
    ("ordo-runtime", 6),
    ("ordo-r2p2", 7),
    ("ordo-dds", 7),
    ("ordo-kv", 7),
    ("ordo-bench", 8),
    ("ordo", 9),
];

/// Crates that must stay free of I/O backends and the runtime (sans-I/O).
const PURE: &[&str] = &[
    "ordo-fault",
    "ordo-fabric",
    "ordo-sst",
    "ordo-ring",
    "ordo-sim",
    "ordo-vsync",
    "ordo-acuerdo",
    "ordo-raft",
];
const IMPURE: &[&str] = &["ordo-runtime", "ordo-fabric-shm", "ordo-fabric-tcp"];

#[test]
fn dependencies_point_down_only() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut violations = Vec::new();
    let packages = meta["packages"].as_array().expect("packages");
    assert!(packages.len() >= 9, "expected the whole workspace, got {} packages", packages.len());
    for package in packages {
        let name = package["name"].as_str().unwrap();
        let Some(&own) = layer.get(name) else {
            violations.push(format!("{name} has no layer in tests/layering.rs"));
            continue;
        };
        for dep in package["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            if !dep_name.starts_with("ordo") {
                continue;
            }
            let kind = dep["kind"].as_str().unwrap_or("normal");
            let Some(&theirs) = layer.get(dep_name) else {
                violations.push(format!("{name} depends on unclassified {dep_name}"));
                continue;
            };
            if kind != "dev" && theirs >= own {
                violations.push(format!("{name} (layer {own}) depends on {dep_name} (layer {theirs})"));
            }
            if PURE.contains(&name) && IMPURE.contains(&dep_name) {
                violations.push(format!("{name} must stay sans-I/O but depends ({kind}) on {dep_name}"));
            }
        }
    }
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
}
