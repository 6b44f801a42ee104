//! `dds`: seeded simulation of ordo-dds — the `vsync-views` run (crashes,
//! the view leader killed mid-change, partitions, restarts that rejoin
//! with state transfer, a lossy control plane) whose messages are DDS
//! samples and whose members each run ordo-dds's production
//! [`DomainCore`](ordo_dds::DomainCore) over their deliveries, snapshots
//! and restores, with an in-place subscriber per topic.
//!
//! `ordo sim --workload dds --seed N` replays a seed.
//!
//! # What one seed draws
//! Everything `vsync-views` draws; each subgroup is a topic of its members
//! whose QoS level is `unordered` for an unordered subgroup, else one of
//! `atomic-multicast`, `volatile-storage`, `logged-storage`, with a
//! history of 1..=20 samples and instance keys. Each member's logged topic
//! lives on a simulated disk that outlives its incarnations; a restarted
//! member finds it after a **power loss** (`MemDisk::crash`: unsynced
//! writes dropped, a torn prefix kept).
//!
//! # Checked
//! - Every `vsync-views` property over the DDS samples (ordering — total
//!   order for ordered topics, sender order for all —, failure atomicity,
//!   virtual synchrony, no loss for members that stay, integrity, state
//!   transfer, liveness), and at the end every member of an ordered topic
//!   holds the same topic state (delivered count and history).
//! - **positions**: members agree on every ordered topic's sample at each
//!   position (what subscribers saw, restored histories), and a subscriber
//!   sees positions in increasing order, each once. Positions are compared
//!   within a **generation** of the topic: a view in which the topic had no
//!   holder left (every member of it failed; its joiners restore an empty
//!   state) restarts it at position 1 (see [`ordo_dds::core`] on
//!   whole-topic restarts).
//! - **catch-up**: a joiner restores exactly a snapshot that a member took
//!   for its first view (the history at the join point), contiguous and
//!   ending at its delivered count, at most `history` samples.
//! - **durability** (logged storage): after a power loss, a member's log
//!   still holds every sample its subscriber saw in its last segment (a
//!   sample is seen only after its sync; a segment starts at a start, a
//!   restore or a whole-topic restart).

use crate::vsync_views::{self as views, Params, ViewsEvent, violation};
use crate::{SeedReport, Workload};
use ordo_dds::QosLevel;
use ordo_fabric::MemberId;
use ordo_sim::{Checker, FaultNote, History, Violation};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The workload's name.
pub const NAME: &str = "dds";

/// The registry entry (`ordo sim --workload dds`).
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "ordo-dds over vsync view changes: every QoS level, crashes, partitions, joins with state \
              transfer, power loss of logged topics; vsync-views' properties plus DDS positions, late-joiner \
              catch-up and log durability",
    run: |seed, _| {
        let (digest, summary) = run(seed)?;
        Ok(SeedReport { workload: NAME.into(), seed, history_digest: digest, summary })
    },
};

/// Every checker: `vsync-views`' (integrity over DDS samples) and the DDS
/// ones.
pub fn checkers(params: &Params) -> Vec<Box<dyn Checker<ViewsEvent>>> {
    let topics = params.dds.clone().expect("dds parameters");
    let mut c = views::checkers(&params.group);
    for x in c.iter_mut() {
        if x.name() == "integrity, no duplication, FIFO" {
            *x = Box::new(views::Integrity { group: Arc::new(params.group.clone()), dds: true });
        }
    }
    c.push(Box::new(Positions { topics: topics.clone() }));
    c.push(Box::new(CatchUp { topics: topics.clone() }));
    c.push(Box::new(Durability { topics }));
    c
}

/// Runs and checks one seed: (history digest, summary).
pub fn run(seed: u64) -> Result<(u64, String), String> {
    let params = Params::draw_dds(seed);
    let history = std::panic::catch_unwind(|| views::simulate(seed, &params))
        .map_err(|p| format!("seed {seed}: panicked: {}", crate::panic_message(&*p)))?;
    ordo_sim::check_all(&history, &checkers(&params)).map_err(|v| format!("seed {seed}: {v}"))?;
    let count = |f: &dyn Fn(&ViewsEvent) -> bool| history.entries.iter().filter(|e| f(&e.event)).count();
    let seen = count(&|e| matches!(e, ViewsEvent::DdsSeen { .. }));
    let restored = count(&|e| matches!(e, ViewsEvent::DdsRestored { .. }));
    let recovered = count(&|e| matches!(e, ViewsEvent::DdsRecovered { delivered, .. } if *delivered > 0));
    let crashes = history.faults.iter().filter(|f| matches!(f.fault, FaultNote::Crash { .. })).count();
    let qos: Vec<&str> = params.dds.as_ref().expect("dds").iter().map(|t| t.qos.name()).collect();
    let summary = format!(
        "{NAME} seed {seed}: passed — {} members, topics {qos:?}, {seen} samples seen, {restored} histories \
         restored, {recovered} logs replayed, {crashes} crashes (digest {:#018x})",
        params.group.members.len(),
        history.digest()
    );
    Ok((history.digest(), summary))
}

type Sample = (MemberId, u64, u64);

struct Positions {
    topics: Arc<Vec<ordo_dds::TopicConfig>>,
}

/// Per topic, the views at whose start it restarted with no holder (a
/// joiner's empty restore, which `vsync-views`' state-transfer checker
/// verifies had no holder): each starts a new generation.
fn restarts(h: &History<ViewsEvent>, topic: usize) -> BTreeSet<u64> {
    let reset: BTreeSet<(MemberId, u64)> = h
        .entries
        .iter()
        .filter(|e| matches!(e.event, ViewsEvent::DdsReset { topic: t } if t == topic))
        .map(|e| (e.member, e.incarnation))
        .collect();
    h.entries
        .iter()
        .filter_map(|e| match e.event {
            ViewsEvent::Restored { view, subgroup, .. }
                if subgroup == topic && reset.contains(&(e.member, e.incarnation)) =>
            {
                Some(view)
            }
            _ => None,
        })
        .collect()
}

impl Checker<ViewsEvent> for Positions {
    fn name(&self) -> &'static str {
        "dds positions"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let ordered = |t: usize| self.topics[t].qos.ordered();
        let restarts: Vec<BTreeSet<u64>> = (0..self.topics.len()).map(|t| restarts(h, t)).collect();
        let gen_of = |t: usize, v: u64| restarts[t].range(..=v).count() as u64;
        // The view each incarnation restored topic t in.
        let mut restored_in: BTreeMap<(MemberId, u64, usize), u64> = BTreeMap::new();
        for e in &h.entries {
            if let ViewsEvent::Restored { view, subgroup, .. } = &e.event {
                restored_in.insert((e.member, e.incarnation, *subgroup), *view);
            }
        }
        let mut at: BTreeMap<(usize, u64, u64), (Sample, MemberId)> = BTreeMap::new();
        let mut agree = |t: usize,
                         era: u64,
                         pos: u64,
                         s: Sample,
                         who: MemberId,
                         what: &str|
         -> Result<(), Violation> {
            if !ordered(t) {
                return Ok(());
            }
            match at.get(&(t, era, pos)) {
                Some((other, m)) if *other != s => violation(
                    "dds positions",
                    format!(
                        "topic {t} generation {era} position {pos}: m{m} has {other:?}, m{who} ({what}) {s:?}"
                    ),
                ),
                Some(_) => Ok(()),
                None => {
                    at.insert((t, era, pos), (s, who));
                    Ok(())
                }
            }
        };
        let mut last: BTreeMap<(MemberId, u64, usize), u64> = BTreeMap::new();
        for e in &h.entries {
            match &e.event {
                ViewsEvent::DdsSeen { topic, view, position, sender, seq, digest } => {
                    let era = gen_of(*topic, *view);
                    agree(*topic, era, *position, (*sender, *seq, *digest), e.member, "saw")?;
                    let l = last.entry((e.member, e.incarnation, *topic)).or_insert(0);
                    if ordered(*topic) && *position <= *l {
                        return violation(
                            self.name(),
                            format!("m{} saw topic {topic} position {position} after {l}", e.member),
                        );
                    }
                    *l = *position;
                }
                ViewsEvent::DdsRestored { topic, history, .. } => {
                    let v = restored_in.get(&(e.member, e.incarnation, *topic)).copied().unwrap_or(0);
                    let era = gen_of(*topic, v);
                    for (p, s, q, d) in history {
                        agree(*topic, era, *p, (*s, *q, *d), e.member, "restored")?;
                    }
                    // Seen positions continue after the restored ones.
                    if let Some((p, ..)) = history.last() {
                        let l = last.entry((e.member, e.incarnation, *topic)).or_insert(0);
                        *l = (*l).max(*p);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

struct CatchUp {
    topics: Arc<Vec<ordo_dds::TopicConfig>>,
}

impl Checker<ViewsEvent> for CatchUp {
    fn name(&self) -> &'static str {
        "dds late-joiner catch-up"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let mut snaps: BTreeMap<(u64, usize), BTreeSet<u64>> = BTreeMap::new();
        for e in &h.entries {
            if let ViewsEvent::DdsSnapshot { view, topic, digest } = &e.event {
                snaps.entry((*view, *topic)).or_default().insert(*digest);
            }
        }
        for e in &h.entries {
            let ViewsEvent::DdsRestored { topic, digest, delivered, history } = &e.event else { continue };
            let t = &self.topics[*topic];
            // The restore of a view is recorded with the Restored event of
            // the same call; any view this incarnation restored in.
            let views: Vec<u64> = h
                .entries
                .iter()
                .filter(|x| (x.member, x.incarnation) == (e.member, e.incarnation))
                .filter_map(|x| match &x.event {
                    ViewsEvent::Restored { view, subgroup, .. } if subgroup == topic => Some(*view),
                    _ => None,
                })
                .collect();
            if !views.iter().any(|v| snaps.get(&(*v, *topic)).is_some_and(|s| s.contains(digest))) {
                return violation(
                    self.name(),
                    format!(
                        "m{} restored topic {topic} (digest {digest:#x}) that no member snapshotted for its views {views:?}",
                        e.member
                    ),
                );
            }
            let want: Vec<u64> = (delivered + 1 - history.len() as u64..=*delivered).collect();
            let got: Vec<u64> = history.iter().map(|x| x.0).collect();
            if history.len() > t.history
                || (t.qos.stores() && got != want)
                || (!t.qos.stores() && !history.is_empty())
            {
                return violation(
                    self.name(),
                    format!(
                        "m{} restored topic {topic} ({}, history {}) with positions {got:?} for {delivered} delivered",
                        e.member,
                        t.qos.name(),
                        t.history
                    ),
                );
            }
        }
        Ok(())
    }
}

struct Durability {
    topics: Arc<Vec<ordo_dds::TopicConfig>>,
}

impl Checker<ViewsEvent> for Durability {
    fn name(&self) -> &'static str {
        "dds logged storage survives power loss"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        // Highest position each member's subscriber saw in its current
        // segment, per logged topic (over incarnations: the disk stays).
        let mut seen: BTreeMap<(MemberId, usize), u64> = BTreeMap::new();
        for e in &h.entries {
            match &e.event {
                ViewsEvent::DdsRestored { topic, .. } | ViewsEvent::DdsReset { topic } => {
                    seen.insert((e.member, *topic), 0);
                }
                ViewsEvent::DdsSeen { topic, position, .. }
                    if self.topics[*topic].qos == QosLevel::LoggedStorage =>
                {
                    let s = seen.entry((e.member, *topic)).or_insert(0);
                    *s = (*s).max(*position);
                }
                ViewsEvent::DdsRecovered { topic, delivered, .. } => {
                    let before = seen.get(&(e.member, *topic)).copied().unwrap_or(0);
                    if *delivered < before {
                        return violation(
                            self.name(),
                            format!(
                                "m{} (incarnation {}) replayed topic {topic}'s log to position {delivered}, but saw {before} before the power loss",
                                e.member, e.incarnation
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
