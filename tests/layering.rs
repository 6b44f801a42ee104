//! Dependencies point down only (DESIGN.md §1). Reads `cargo metadata` and
//! fails if a crate depends on one of its own layer or above, if an engine,
//! the SST, the rings or the simulator depend on the runtime or a real
//! fabric backend (even as a dev-dependency, for all but the simulator's
//! users), or if a new `ordo-*` crate has not been given a layer here; and
//! that the R2P2 stack links no fabric backend, fabric engine or runtime.

use std::collections::BTreeMap;
use std::process::Command;

/// (crate, layer). Lower layers may not depend on higher ones.
const LAYERS: &[(&str, u32)] = &[
    ("ordo-fault", 0),
    ("ordo-fabric", 1),
    ("ordo-auth", 1),
    ("ordo-agent", 2),
    ("ordo-sst", 2),
    ("ordo-ring", 3),
    ("ordo-fabric-shm", 2),
    ("ordo-fabric-tcp", 2),
    ("ordo-fabric-ofi", 2),
    ("ordo-sim", 4),
    ("ordo-vsync", 5),
    ("ordo-acuerdo", 5),
    ("ordo-raft", 5),
    ("ordo-kv-core", 5),
    ("ordo-runtime", 6),
    ("ordo-r2p2", 7),
    ("ordo-kv", 8),
    ("ordo-simulation", 9),
    ("ordo-dds", 8),
    ("ordo-bench", 9),
    ("ordo", 10),
];

/// Crates that must stay free of I/O backends and the runtime (sans-I/O).
const PURE: &[&str] = &[
    "ordo-fault",
    "ordo-auth",
    "ordo-fabric",
    "ordo-agent",
    "ordo-sst",
    "ordo-ring",
    "ordo-sim",
    "ordo-vsync",
    "ordo-acuerdo",
    "ordo-raft",
    "ordo-kv-core",
];
const IMPURE: &[&str] = &["ordo-runtime", "ordo-fabric-shm", "ordo-fabric-tcp", "ordo-fabric-ofi"];

/// What the UDP stack may not link, even indirectly: it runs on the agent
/// crate, not the runtime, and needs no fabric backend or fabric engine.
const NOT_UNDER_R2P2: &[&str] = &[
    "ordo-runtime",
    "ordo-fabric-shm",
    "ordo-fabric-tcp",
    "ordo-fabric-ofi",
    "ordo-vsync",
    "ordo-acuerdo",
    "ordo-sim",
];

/// The crates `root` links (normal dependencies, transitively), from the
/// resolved graph of `cargo metadata`.
fn normal_closure(meta: &serde_json::Value, root: &str) -> Vec<String> {
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve nodes");
    let name_of = |id: &str| id.to_string();
    let by_id: BTreeMap<String, &serde_json::Value> =
        nodes.iter().map(|n| (name_of(n["id"].as_str().unwrap()), n)).collect();
    let packages = meta["packages"].as_array().expect("packages");
    let pkg_name: BTreeMap<String, String> = packages
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["name"].as_str().unwrap().to_string()))
        .collect();
    let root_id = pkg_name.iter().find(|(_, n)| *n == root).map(|(id, _)| id.clone()).expect("root package");
    let mut seen = std::collections::BTreeSet::new();
    let mut stack = vec![root_id];
    while let Some(id) = stack.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        for dep in by_id[&id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null());
            if normal {
                stack.push(dep["pkg"].as_str().unwrap().to_string());
            }
        }
    }
    seen.iter().filter_map(|id| pkg_name.get(id).cloned()).collect()
}

#[test]
fn r2p2_links_no_fabric_backend_engine_or_runtime() {
    // The resolved graph for this host only (other targets' dependencies
    // may not be in the local registry).
    let rustc = Command::new("rustc").arg("-vV").output().expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let linked = normal_closure(&meta, "ordo-r2p2");
    assert!(linked.iter().any(|n| n == "ordo-agent"), "ordo-r2p2 runs on ordo-agent: {linked:?}");
    assert!(linked.iter().any(|n| n == "ordo-raft"), "the closure is real: {linked:?}");
    let bad: Vec<&String> = linked.iter().filter(|n| NOT_UNDER_R2P2.contains(&n.as_str())).collect();
    assert!(bad.is_empty(), "ordo-r2p2 links {bad:?}");
    // The check can fail: the runtime links what r2p2 must not.
    let runtime = normal_closure(&meta, "ordo-runtime");
    assert!(runtime.iter().any(|n| n == "ordo-fabric-shm"), "{runtime:?}");
}

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
