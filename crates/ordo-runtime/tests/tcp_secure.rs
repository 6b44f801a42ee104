//! A tcp group started from configuration files the way an operator would:
//! `security.secret_file` (made by `Secret::generate_file`, what `ordo
//! secret new` runs) and `[fabric.tcp.tls]` PEM files. The members link
//! and carry writes; a member whose file holds another secret does not.

use ordo_fabric::{Fabric, FabricEvent, Write, WriteTag};
use ordo_runtime::{MemberFabric, OrdoConfig, Secret, WiringError, connect_fabric};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ordo-tcp-secure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A CA and a certificate for 127.0.0.1 per member, as PEM files.
fn pki(dir: &Path, members: usize) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for m in 0..members {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(dir.join(format!("m{m}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("m{m}.key")), key.serialize_pem()).unwrap();
    }
}

fn config(dir: &Path, id: u32, ports: &[u16], secret: &Path) -> OrdoConfig {
    let text = format!(
        r#"
[member]
id = {id}
[group]
members = [0, 1]
[fabric]
backend = "tcp"
region_bytes = 4096
[fabric.tcp]
peers = [{{ id = 0, addr = "127.0.0.1:{p0}" }}, {{ id = 1, addr = "127.0.0.1:{p1}" }}]
connect_timeout_ms = 3000
[fabric.tcp.tls]
cert = "{d}/m{id}.pem"
key = "{d}/m{id}.key"
ca = "{d}/ca.pem"
[security]
secret_file = "{s}"
"#,
        p0 = ports[0],
        p1 = ports[1],
        d = dir.display(),
        s = secret.display()
    );
    OrdoConfig::load_str(&text, Path::new("member.toml"), std::iter::empty(), &[]).expect("valid config")
}

fn free_ports() -> Vec<u16> {
    (0..2).map(|_| ordo_runtime::unused_local_port().expect("a free port")).collect()
}

fn start(configs: Vec<OrdoConfig>) -> Vec<Result<MemberFabric, WiringError>> {
    let handles: Vec<_> =
        configs.into_iter().map(|c| std::thread::spawn(move || connect_fabric(&c))).collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn members_from_config_files_link_with_a_secret_file_and_tls() {
    let dir = scratch();
    pki(&dir, 2);
    let secret = dir.join("cluster.secret");
    Secret::generate_file(&secret).unwrap();
    let ports = free_ports();
    let mut members: Vec<MemberFabric> = start((0..2).map(|id| config(&dir, id, &ports, &secret)).collect())
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    members[0].region().store_release(64, 42);
    members[0].post_write(Write::signaled(1, 64, 8, WriteTag(1))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = Vec::new();
    while !events.iter().any(|e| matches!(e, FabricEvent::Completed { .. })) {
        assert!(Instant::now() < deadline, "no completion: {events:?}");
        members[0].poll_events(&mut events);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(members[1].region().load_acquire(64), 42);

    // Member 1 restarted with another secret file: it cannot join.
    drop(members);
    let other = dir.join("other.secret");
    Secret::generate_file(&other).unwrap();
    let ports = free_ports();
    let mut configs = vec![config(&dir, 0, &ports, &secret), config(&dir, 1, &ports, &other)];
    for c in &mut configs {
        c.fabric.tcp.connect_timeout_ms = 800;
    }
    for r in start(configs) {
        assert!(matches!(r, Err(WiringError::Tcp(ordo_fabric_tcp::TcpError::ConnectTimeout { .. }))));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
