//! The fabric conformance [`Harness`] for the simulated fabric.
//!
//! # Invariants
//! - `run` calls the parts one at a time, in an order drawn from the seed
//!   each round, and between rounds lets the network make progress by a
//!   seeded amount of simulated time; so every interleaving it produces is
//!   replayable from the harness seed.
//! - `pause` advances the simulated clock of the group made last; `kill`
//!   crashes the member (its in-flight writes are dropped and peers' writes
//!   to it are lost, so they time out and suspect it).
//! - Each group is a fresh world with its own derived seed.
//!
//! [`Harness`]: ordo_fabric::conformance::Harness

use crate::fabric::SimFabric;
use crate::rng::{SimRng, derive_seed};
use crate::world::{SimConfig, World};
use ordo_fabric::Fabric;
use ordo_fabric::conformance::{Harness, Part};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs the fabric conformance suite against [`SimFabric`].
pub struct SimHarness {
    seed: u64,
    groups: u64,
    rng: SimRng,
    /// Template for each group's world (members and region length are set
    /// per group).
    pub config: SimConfig,
    /// Simulated time one `pause` lets pass.
    pub pause_ns: u64,
    world: Option<Arc<Mutex<World>>>,
}

impl SimHarness {
    /// A harness whose every choice derives from `seed`.
    pub fn new(seed: u64) -> SimHarness {
        let mut config = SimConfig::default();
        config.fabric.completion_timeout_ns = 1_000_000;
        SimHarness { seed, groups: 0, rng: SimRng::new(seed), config, pause_ns: 50_000, world: None }
    }

    /// The world of the group made last.
    pub fn world(&self) -> Option<&Arc<Mutex<World>>> {
        self.world.as_ref()
    }

    fn advance(&mut self, dt_ns: u64) {
        if let Some(w) = &self.world {
            w.lock().expect("world lock").advance_by(dt_ns);
        }
    }
}

impl Harness for SimHarness {
    type Fabric = SimFabric;

    fn group(&mut self, n: usize, region_len: usize) -> Vec<SimFabric> {
        self.groups += 1;
        let mut cfg = self.config.clone();
        cfg.members = u32::try_from(n).expect("group size");
        cfg.region_len = region_len;
        let world = Arc::new(Mutex::new(World::new(cfg, derive_seed(self.seed, self.groups))));
        self.world = Some(world.clone());
        SimFabric::attach_all(&world)
    }

    fn run(
        &mut self,
        mut members: Vec<SimFabric>,
        mut parts: Vec<Part<SimFabric>>,
        limit: Duration,
    ) -> Vec<SimFabric> {
        assert_eq!(members.len(), parts.len(), "one part per member");
        let deadline = Instant::now() + limit;
        let mut finished = vec![false; parts.len()];
        let mut order: Vec<usize> = (0..parts.len()).collect();
        let max_step = 2 * self.config.fabric.delay_max_ns;
        loop {
            self.rng.shuffle(&mut order);
            for &i in &order {
                if !finished[i] {
                    finished[i] = parts[i](&mut members[i]);
                }
            }
            if finished.iter().all(|f| *f) {
                return members;
            }
            assert!(Instant::now() < deadline, "parts did not finish within {limit:?}");
            let dt = self.rng.range(0, max_step);
            self.advance(dt);
        }
    }

    fn kill(&mut self, member: SimFabric) {
        member.world().lock().expect("world lock").crash(member.member());
    }

    fn has_doorbell(&self) -> bool {
        false
    }

    fn pause(&mut self) {
        let dt = self.pause_ns;
        self.advance(dt);
    }
}
