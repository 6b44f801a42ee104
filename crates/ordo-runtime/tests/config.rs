//! Configuration loading: defaults, precedence, overrides, validation, and
//! error reporting. The environment is passed in; the process's is untouched.

use ordo_runtime::{
    Backend, ConfigError, CorePinning, EXAMPLE_CONFIG, IdleStrategy, IdleStrategyKind, OrdoConfig,
    OverrideOrigin, ThreadingMode, ValidationError,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn sets(pairs: &[&str]) -> Vec<String> {
    pairs.iter().map(|s| s.to_string()).collect()
}

/// A config file in the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ordo-runtime-test-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn load_text(text: &str, cli: &[&str]) -> Result<OrdoConfig, ConfigError> {
    OrdoConfig::load_str(text, Path::new("test.toml"), no_env(), &sets(cli))
}

fn invalid(text: &str, cli: &[&str]) -> ValidationError {
    match load_text(text, cli) {
        Err(ConfigError::Invalid(e)) => e,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

const TCP3: &str = r#"
[member]
id = 0
[group]
members = [0, 1, 2]
[fabric]
backend = "tcp"
[fabric.tcp]
listen = "127.0.0.1:7000"
peers = [{ id = 1, addr = "127.0.0.1:7001" }, { id = 2, addr = "127.0.0.1:7002" }]
[security]
secret_env = "ORDO_CONFIG_TEST_SECRET"
"#;

#[test]
fn an_empty_file_gives_the_defaults() {
    let file = TempFile::new("empty", "");
    let config = OrdoConfig::load(Some(&file.0), no_env(), &[]).unwrap();
    assert_eq!(config, OrdoConfig::default());
    assert_eq!(OrdoConfig::load(None, no_env(), &[]).unwrap(), config);
    assert_eq!(config.member.id, 0);
    assert_eq!(config.group.members, [0]);
    assert_eq!(config.fabric.backend, Backend::Shm);
    assert_eq!(config.fabric.region_bytes, 1 << 20);
    assert_eq!(config.fabric.write_timeout(), Duration::from_secs(1));
    assert_eq!(config.fabric.shm.dir, Path::new("/dev/shm"));
    assert_eq!(config.fabric.shm.cluster, "ordo");
    assert_eq!(config.fabric.shm.liveness_check_interval(), Duration::from_millis(1));
    assert_eq!(config.fabric.tcp.listen, None);
    assert_eq!(config.fabric.tcp.max_frame_bytes, 1 << 20);
    assert_eq!(config.runtime.threading, ThreadingMode::Dedicated);
    assert!(!config.runtime.pin_cores);
    assert_eq!(config.runtime.idle.strategy, IdleStrategyKind::Auto);
    assert_eq!(config.idle_strategy(), IdleStrategy::DEFAULT, "a one-member group never outnumbers the CPUs");
    assert!(config.peers().is_empty());
}

#[test]
fn precedence_is_file_then_env_then_cli() {
    let file = TempFile::new(
        "precedence",
        "[fabric]\nregion_bytes = 4096\nwrite_timeout_ms = 10\n[fabric.shm]\ncluster = \"from-file\"\n",
    );
    let env = env(&[
        ("ORDO__FABRIC__REGION_BYTES", "8192"),
        ("ORDO__FABRIC__WRITE_TIMEOUT_MS", "20"),
        ("ORDO__RUNTIME__IDLE__PARK_MAX_US", "5000"),
        ("PATH", "/usr/bin"),
        ("ORDO_FABRIC_BACKEND", "tcp"), // single underscores: not ours
    ]);
    let cli = sets(&["fabric.region_bytes=16384", "runtime.threading=shared", "runtime.threading=dedicated"]);
    let config = OrdoConfig::load(Some(&file.0), env, &cli).unwrap();
    assert_eq!(config.fabric.region_bytes, 16384, "CLI beats env and file");
    assert_eq!(config.fabric.write_timeout_ms, 20, "env beats file");
    assert_eq!(config.fabric.shm.cluster, "from-file", "file beats defaults");
    assert_eq!(config.runtime.idle.park_max_us, 5000, "nested env keys");
    assert_eq!(config.runtime.threading, ThreadingMode::Dedicated, "the later CLI pair wins");
    assert_eq!(config.fabric.backend, Backend::Shm);
}

#[test]
fn override_values_are_toml_literals_or_strings() {
    let config = load_text(
        "",
        &[
            "group.members=[0, 1, 2]",
            "member.id=2",
            "runtime.pin_cores=true",
            "fabric.backend=tcp",
            "fabric.tcp.listen=127.0.0.1:7002",
            r#"fabric.tcp.peers=[{ id = 0, addr = "h0:7000" }, { id = 1, addr = "h1:7001" }]"#,
            r#"fabric.shm.cluster="42""#,
            "runtime.idle.strategy=spin-then-yield",
            "runtime.idle.spins = 7",
            "security.secret_file=/etc/ordo/secret",
        ],
    )
    .unwrap();
    assert_eq!(config.security.secret_file.as_deref(), Some(Path::new("/etc/ordo/secret")));
    assert_eq!(config.group.members, [0, 1, 2]);
    assert_eq!(config.member.id, 2);
    assert_eq!(config.core_pinning(), CorePinning::RoundRobin);
    assert_eq!(config.fabric.backend, Backend::Tcp);
    assert_eq!(config.fabric.tcp.listen.as_deref(), Some("127.0.0.1:7002"));
    assert_eq!(config.fabric.tcp.peer_addr(1), Some("h1:7001"));
    assert_eq!(config.fabric.shm.cluster, "42", "a quoted number stays a string");
    assert_eq!(config.idle_strategy(), IdleStrategy::SpinThenYield { spins: 7 });
    assert_eq!(config.peers(), [0, 1]);
    let options = config.runner_options();
    assert_eq!(options.pinning, CorePinning::RoundRobin);
    assert_eq!(options.idle, IdleStrategy::SpinThenYield { spins: 7 });
}

#[test]
fn env_overrides_map_double_underscores_to_dots() {
    let config = OrdoConfig::load_str(
        TCP3,
        Path::new("t.toml"),
        env(&[("ORDO__FABRIC__BACKEND", "shm"), ("ORDO__RUNTIME__IDLE__STRATEGY", "busy-spin")]),
        &[],
    )
    .unwrap();
    assert_eq!(config.fabric.backend, Backend::Shm);
    assert_eq!(config.idle_strategy(), IdleStrategy::BusySpin);
}

#[test]
fn bad_overrides_are_rejected_naming_the_override() {
    match load_text("", &["fabric.backend=udp"]) {
        Err(ConfigError::Override { origin: OverrideOrigin::Cli, text, reason }) => {
            assert_eq!(text, "fabric.backend=udp");
            assert!(reason.contains("udp"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let result =
        OrdoConfig::load_str("", Path::new("t"), env(&[("ORDO__FABRIC__REGION_BYTES", "lots")]), &[]);
    match result {
        Err(ConfigError::Override { origin: OverrideOrigin::Env(var), reason, .. }) => {
            assert_eq!(var, "ORDO__FABRIC__REGION_BYTES");
            assert!(reason.contains("region_bytes"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Unknown key.
    let err = load_text("", &["fabric.regoin_bytes=64"]).unwrap_err();
    assert!(matches!(err, ConfigError::Override { .. }), "{err:?}");
    assert!(err.to_string().contains("regoin_bytes"), "{err}");
    // No '='.
    let err = load_text("", &["fabric.backend"]).unwrap_err();
    assert!(err.to_string().contains("expected key=value"), "{err}");
    // Descending into a value.
    let err = load_text("[fabric]\nbackend = \"shm\"\n", &["fabric.backend.kind=tcp"]).unwrap_err();
    assert!(err.to_string().contains("`fabric.backend` is a value"), "{err}");
    let err = load_text("", &["fabric.backend.kind=tcp"]).unwrap_err();
    assert!(err.to_string().contains("fabric.backend"), "{err}");
    // Empty key segment.
    let err = load_text("", &["fabric..backend=tcp"]).unwrap_err();
    assert!(matches!(err, ConfigError::Override { .. }), "{err:?}");
    // A bad env value fixed by the CLI is fine: the CLI wins.
    let config = OrdoConfig::load_str(
        "",
        Path::new("t"),
        env(&[("ORDO__FABRIC__BACKEND", "udp")]),
        &sets(&["fabric.backend=shm"]),
    )
    .unwrap();
    assert_eq!(config.fabric.backend, Backend::Shm);
}

#[test]
fn every_validation_error_names_its_key() {
    let cases: Vec<(ValidationError, &str)> = vec![
        (invalid("", &["group.members=[]"]), "group.members"),
        (invalid("", &["group.members=[0, 1, 0]"]), "group.members"),
        (invalid("", &["member.id=5"]), "member.id"),
        (invalid("", &["fabric.region_bytes=0"]), "fabric.region_bytes"),
        (invalid("", &["fabric.region_bytes=100"]), "fabric.region_bytes"),
        (invalid("", &["fabric.write_timeout_ms=0"]), "fabric.write_timeout_ms"),
        (invalid("", &["runtime.idle.park_min_us=0"]), "runtime.idle.park_min_us"),
        (
            invalid("", &["runtime.idle.park_min_us=500", "runtime.idle.park_max_us=100"]),
            "runtime.idle.park_min_us",
        ),
        (invalid("", &["fabric.shm.dir="]), "fabric.shm.dir"),
        (invalid("", &["fabric.shm.cluster=a/b"]), "fabric.shm.cluster"),
        (invalid("", &["fabric.shm.liveness_check_us=0"]), "fabric.shm.liveness_check_us"),
        (invalid("", &["fabric.backend=tcp"]), "fabric.tcp.listen"),
        (invalid(TCP3, &["fabric.tcp.listen=nohost"]), "fabric.tcp.listen"),
        (invalid(TCP3, &["fabric.tcp.listen=:7000"]), "fabric.tcp.listen"),
        (invalid(TCP3, &["fabric.tcp.listen=h:99999"]), "fabric.tcp.listen"),
        (invalid(TCP3, &[r#"fabric.tcp.peers=[{ id = 1, addr = "h:1" }]"#]), "fabric.tcp.peers"),
        (
            invalid(TCP3, &[r#"fabric.tcp.peers=[{ id = 1, addr = "h:1" }, { id = 2, addr = "h" }]"#]),
            "fabric.tcp.peers[1].addr",
        ),
        (
            invalid(TCP3, &[r#"fabric.tcp.peers=[{ id = 1, addr = "h:1" }, { id = 9, addr = "h:2" }]"#]),
            "fabric.tcp.peers",
        ),
        (
            invalid(TCP3, &[r#"fabric.tcp.peers=[{ id = 1, addr = "h:1" }, { id = 1, addr = "h:2" }]"#]),
            "fabric.tcp.peers",
        ),
        (invalid(TCP3, &["fabric.tcp.max_frame_bytes=10000000"]), "fabric.tcp.max_frame_bytes"),
        (invalid(TCP3, &["fabric.tcp.connect_timeout_ms=0"]), "fabric.tcp.connect_timeout_ms"),
        (invalid(TCP3, &["fabric.tcp.handshake_timeout_ms=0"]), "fabric.tcp.handshake_timeout_ms"),
        (invalid(TCP3, &["security.secret_file=s"]), "security.secret_env"),
    ];
    for (error, key) in &cases {
        assert_eq!(error.key(), *key, "{error}");
        assert!(error.to_string().contains(key), "message {error:?} must name {key}");
    }
    use ValidationError::*;
    assert_eq!(cases[0].0, EmptyGroup);
    assert_eq!(cases[1].0, DuplicateMember { id: 0 });
    assert_eq!(cases[2].0, MemberNotInGroup { id: 5, members: vec![0] });
    assert_eq!(cases[4].0, RegionBytes { value: 100 });
    assert_eq!(cases[7].0, ParkRange { park_min_us: 500, park_max_us: 100 });
    assert_eq!(cases[11].0, TcpListenMissing { id: 0 });
    assert_eq!(cases[15].0, TcpPeerMissing { id: 2 });
    assert_eq!(cases[17].0, TcpPeerNotInGroup { id: 9 });
    assert_eq!(cases[18].0, TcpPeerDuplicate { id: 1 });
    assert!(matches!(cases[19].0, FrameExceedsSendBuffer { .. }));
    // The tcp section is not checked when the backend is shm.
    load_text(TCP3, &["fabric.backend=shm", "fabric.tcp.listen=nohost"]).unwrap();
}

#[test]
fn the_tcp_backend_needs_a_secret_unless_told_otherwise() {
    let without = TCP3.replace("[security]\nsecret_env = \"ORDO_CONFIG_TEST_SECRET\"\n", "");
    assert_ne!(without, TCP3);
    let err = invalid(&without, &[]);
    assert_eq!(err, ValidationError::SecretMissing);
    assert!(err.to_string().contains("security.secret_file") && err.to_string().contains("ordo secret new"));
    let config = load_text(&without, &["security.allow_unauthenticated=true"]).unwrap();
    assert_eq!(config.security.source(), None);
    // shm needs none: its regions are protected by file ownership and modes.
    load_text(&without, &["fabric.backend=shm"]).unwrap();
}

#[test]
fn a_secret_that_cannot_be_read_stops_the_member_with_a_message_naming_its_source() {
    let config = load_text(TCP3, &["security.secret_env=ORDO_CONFIG_TEST_SECRET_UNSET"]).unwrap();
    let Err(err) = ordo_runtime::connect_fabric(&config) else { panic!("connected without a secret") };
    assert_eq!(err.to_string(), "the secret environment variable ORDO_CONFIG_TEST_SECRET_UNSET is not set");
}

#[test]
fn tcp_listen_defaults_to_the_own_peer_entry() {
    let text = r#"
[member]
id = 1
[group]
members = [0, 1]
[fabric]
backend = "tcp"
[fabric.tcp]
peers = [{ id = 0, addr = "10.0.0.1:7000" }, { id = 1, addr = "10.0.0.2:7000" }]
[security]
secret_file = "cluster.secret"
"#;
    let config = load_text(text, &[]).unwrap();
    assert_eq!(config.fabric.tcp.listen_addr(1), Some("10.0.0.2:7000"));
    // The same file serves member 0 (with an env override), and IPv6 works.
    let config = load_text(text, &["member.id=0", "fabric.tcp.listen=[::1]:7000"]).unwrap();
    assert_eq!(config.fabric.tcp.listen_addr(0), Some("[::1]:7000"));
}

#[test]
fn a_malformed_file_is_reported_with_its_name_line_and_column() {
    let file = TempFile::new("malformed", "[member]\nid = 1\n\n[fabric\nbackend = \"tcp\"\n");
    let err = OrdoConfig::load(Some(&file.0), no_env(), &[]).unwrap_err();
    match &err {
        ConfigError::Parse { path, line, column, message } => {
            assert_eq!(path, &file.0);
            assert_eq!(*line, Some(4), "{message}");
            assert!(column.is_some());
        }
        other => panic!("{other:?}"),
    }
    let shown = err.to_string();
    assert!(shown.starts_with(&format!("{}:4:", file.0.display())), "{shown}");
}

#[test]
fn unknown_keys_and_wrong_types_in_the_file_are_rejected_with_their_line() {
    let err = load_text("[fabric]\nbackend = \"shm\"\nregoin_bytes = 64\n", &[]).unwrap_err();
    match &err {
        ConfigError::Parse { line, message, .. } => {
            assert_eq!(*line, Some(3), "{message}");
            assert!(message.contains("regoin_bytes"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let err = load_text("[member]\nid = 0\n[bogus]\nx = 1\n", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { line: Some(3), .. }), "{err:?}");
    assert!(err.to_string().contains("bogus"), "{err}");
    let err = load_text("[fabric]\nregion_bytes = \"big\"\n", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { line: Some(2), .. }), "{err:?}");
    let err = load_text("[fabric.tcp]\npeers = [{ id = 1, adr = \"h:1\" }]\n", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { line: Some(2), .. }), "{err:?}");
}

#[test]
fn a_missing_file_is_a_read_error_naming_it() {
    let path = Path::new("/nonexistent/ordo.toml");
    let err = OrdoConfig::load(Some(path), no_env(), &[]).unwrap_err();
    assert!(matches!(&err, ConfigError::Read { path: p, .. } if p == path), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/ordo.toml"));
}

#[test]
fn to_toml_string_round_trips() {
    for config in [
        OrdoConfig::default(),
        load_text(TCP3, &["runtime.threading=shared", "runtime.idle.strategy=busy-spin"]).unwrap(),
    ] {
        let text = config.to_toml_string();
        let back = load_text(&text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, config, "{text}");
    }
}

#[test]
fn auto_idle_hands_the_core_off_only_when_members_outnumber_cpus() {
    let idle = ordo_runtime::IdleConfig::default();
    assert_eq!(idle.strategy, IdleStrategyKind::Auto);
    let cpus = ordo_agent::online_cpus();
    assert_eq!(idle.strategy_for(cpus), IdleStrategy::DEFAULT);
    assert_eq!(idle.strategy_for(cpus + 1), IdleStrategy::HAND_OFF);
    let fixed = ordo_runtime::IdleConfig { strategy: IdleStrategyKind::BackoffPark, ..idle.clone() };
    assert_eq!(fixed.strategy_for(cpus + 1), IdleStrategy::DEFAULT, "an explicit strategy is kept");
    let hand_off = ordo_runtime::IdleConfig { strategy: IdleStrategyKind::HandOff, ..idle };
    assert_eq!(hand_off.strategy_for(1), IdleStrategy::HAND_OFF);
    let text = "[runtime.idle]\nstrategy = \"hand-off\"\n";
    assert_eq!(load_text(text, &[]).unwrap().runtime.idle.strategy, IdleStrategyKind::HandOff);
}

#[test]
fn the_example_config_loads() {
    let config = load_text(EXAMPLE_CONFIG, &[]).unwrap();
    assert_eq!(config.member.id, 1);
    assert_eq!(config.fabric.backend, Backend::Tcp);
    assert_eq!(config.fabric.tcp.listen_addr(1), Some("127.0.0.1:7001"));
    assert_eq!(config.peers(), [0, 2]);
    let backoff = IdleStrategy::BackoffPark {
        spins: 200,
        yields: 50,
        park_min: Duration::from_micros(20),
        park_max: Duration::from_millis(1),
    };
    // `auto`: three members on this host hand the core off where it has
    // fewer than three CPUs.
    let expected = if ordo_agent::online_cpus() < 3 { IdleStrategy::HAND_OFF } else { backoff };
    assert_eq!(config.idle_strategy(), expected);
}

#[test]
fn vsync_section_defaults_to_one_all_senders_subgroup_and_is_validated() {
    let c = OrdoConfig::load(None, std::iter::empty(), &["group.members=[0,1,2]".to_string()]).unwrap();
    let g = c.vsync_group().unwrap();
    assert_eq!(g.subgroups.len(), 1);
    assert_eq!(g.subgroups[0].senders, vec![0, 1, 2]);
    assert_eq!(g.subgroups[0].window, 100);
    assert_eq!(g.switches, ordo_vsync::Switches::SPINDLE);
    let c = OrdoConfig::load(
        None,
        std::iter::empty(),
        &["group.members=[0,1]".to_string(), "vsync.switches.null_sends=false".to_string()],
    )
    .unwrap();
    assert!(!c.vsync_group().unwrap().switches.null_sends);
    // A sender outside the subgroup is refused, naming the section.
    let c = OrdoConfig::load(
        None,
        std::iter::empty(),
        &[
            "group.members=[0,1]".to_string(),
            "vsync.subgroups=[{members=[0,1], senders=[2], window=4, max_payload=8}]".to_string(),
        ],
    )
    .unwrap();
    let e = c.vsync_group().unwrap_err();
    assert_eq!(e.key(), "vsync");
    assert!(e.to_string().contains("sender 2"), "{e}");
}

#[test]
fn the_ofi_backend_takes_a_provider_and_the_tcp_addresses() {
    let args = [
        "group.members=[0, 1]",
        "member.id=0",
        "fabric.backend=ofi",
        r#"fabric.ofi.provider="verbs""#,
        "fabric.tcp.listen=127.0.0.1:7000",
        r#"fabric.tcp.peers=[{ id = 1, addr = "127.0.0.1:7001" }]"#,
        "security.secret_file=/etc/ordo/secret",
    ];
    let config = load_text("", &args);
    if cfg!(feature = "ofi") {
        let config = config.unwrap();
        assert_eq!(config.fabric.backend, Backend::Ofi);
        assert_eq!(config.fabric.ofi.provider, "verbs");
        assert_eq!(
            config.fabric.ofi.endpoint,
            ordo_runtime::OfiEndpoint::Msg,
            "connected endpoints by default"
        );
    } else {
        let err = config.unwrap_err().to_string();
        assert!(err.contains("--features ofi"), "{err}");
    }
    // Without a secret (and not allowed to run without one): refused.
    let err = load_text("", &args[..6]).unwrap_err().to_string();
    assert!(err.contains("secret") || err.contains("--features ofi"), "{err}");
    // The set-up path needs the tcp addresses.
    let err = load_text("", &[args[0], args[1], args[2], args[6]]).unwrap_err().to_string();
    assert!(err.contains("fabric.tcp") || err.contains("--features ofi"), "{err}");
}

#[test]
fn the_ofi_endpoint_is_rdm_or_msg() {
    let base = [
        "group.members=[0, 1]",
        "member.id=0",
        "fabric.backend=ofi",
        "fabric.tcp.listen=127.0.0.1:7000",
        r#"fabric.tcp.peers=[{ id = 1, addr = "127.0.0.1:7001" }]"#,
        "security.allow_unauthenticated=true",
    ];
    let with = |e: &str| {
        let mut a: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        a.push(format!("fabric.ofi.endpoint={e}"));
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        load_text("", &refs)
    };
    if cfg!(feature = "ofi") {
        assert_eq!(with("msg").unwrap().fabric.ofi.endpoint, ordo_runtime::OfiEndpoint::Msg);
        assert_eq!(with("rdm").unwrap().fabric.ofi.endpoint, ordo_runtime::OfiEndpoint::Rdm);
    }
    let err = with("dgram").unwrap_err().to_string();
    assert!(err.contains("endpoint") || err.contains("dgram"), "{err}");
}
