//! The ordo runtime: the configuration, config → fabric wiring, and the
//! vsync and acuerdo member agents (DESIGN.md §5).
//!
//! Protocol engines are sans-I/O state machines driven by sans-I/O member
//! drivers; this crate runs them for real. The agent machinery (duty cycles,
//! idle strategies that park on the fabric doorbell, dedicated and shared
//! threading modes) lives in `ordo-agent` and is re-exported here, so
//! `ordo_runtime::{Agent, Runner, IdleStrategy, ...}` keep working.
//!
//! # Configuration
//! [`OrdoConfig::load`] reads a TOML file, applies `ORDO__SECTION__KEY`
//! environment variables and then `--set section.key=value` pairs
//! (file < env < CLI), and validates the result. Every key has a default;
//! an empty file is a valid one-member shm configuration. A full example
//! ([`EXAMPLE_CONFIG`]):
//!
#![doc = concat!("```toml\n", include_str!("../example.toml"), "```")]
#![warn(missing_docs)]

pub mod acuerdo;
pub mod config;
pub mod control;
pub mod node;
pub mod status;
pub mod vsync;
pub mod wiring;

pub use config::{
    Backend, ConfigError, DdsConfig, FabricConfig, GroupConfig, IdleConfig, IdleStrategyKind, KvConfig,
    KvDurability, KvEngine, KvReads, MemberConfig, NodeConfig, NodeEngine, OfiConfig, OfiEndpoint,
    OrdoConfig, OverrideOrigin, QosLevel, RuntimeConfig, SecurityConfig, ShmConfig, TcpConfig, TcpPeer,
    TlsFiles, TopicConfig, ValidationError, VsyncConfig,
};
pub use control::{ControlError, ControlPlane};
pub use node::{DeliverFn, Node, NodeApp, NodeError, NodeExit, NodeStatus, ViewFn, ViewSender};
pub use ordo_agent::{
    Agent, AgentLoop, AgentPanic, Clock, CorePinning, IdleAction, IdleStrategy, Idler, Joined,
    MonotonicClock, ParkBell, Runner, RunnerError, RunnerHandle, RunnerOptions, RunnerStats, Step,
    ThreadingMode, online_cpus,
};
pub use ordo_auth::{Secret, SecretError, SecretSource};
pub use status::StatusServer;
pub use vsync::{Delivery, Group, GroupError, LiveCounters, OwnedMessage, SubgroupHandle, VsyncMember};
pub use wiring::{
    HeartbeatAgent, MemberFabric, SECRET_ENV, WiringError, connect_fabric, connect_local_group,
    connect_view_fabric, tcp_options, unused_local_port,
};

/// The example configuration shown in the crate docs (every key, with
/// comments); it loads and validates.
pub const EXAMPLE_CONFIG: &str = include_str!("../example.toml");
