//! A vsync member across views: the view change ([`crate::view`]) driving
//! one [`VsyncDriver`] per view — everything a member does except threads,
//! sockets and clocks. The seeded simulation (`ordo sim --workload
//! vsync-views`) and the member daemon (`ordo node`, `ordo_runtime::Node`)
//! both drive this type.
//!
//! # Invariants
//! - The engine is wedged before the next poll after any suspicion or any
//!   view-change message that wedges (the [`ViewChange`] reports its
//!   received counts taken at that point, frozen from then on).
//! - On a decision the failed view's ragged edge is delivered first, then
//!   the next view's engine is built over a **new fabric endpoint**
//!   (`open`: a new SST and ring layout, nothing carried over), then this
//!   member's own undelivered messages are resent there, in their order,
//!   before any new message: the new ring is empty and has a window of
//!   slots, and a sender never has more than a window of messages
//!   undelivered, so the resends always fit.
//! - Deliveries reach the sink with the **configured** subgroup index
//!   (stable across views), never the view's engine index.
//! - A removed or minority member stops: its engine stays wedged and it
//!   delivers nothing more.
//! - **Joins and state transfer.** A member started with
//!   [`ViewMember::join`] asks to join until a view includes it. At every
//!   install, each member holding the state of an active subgroup it is in
//!   takes a snapshot of it ([`StateTransfer::snapshot`]) right after the
//!   failed view's ragged edge and before anything of the new view is
//!   delivered — the same point at every such member, by virtual
//!   synchrony (so a state costs one snapshot per view change). The joiner
//!   fetches it in chunks ([`ControlMsg::StateRequest`] / `State`, from
//!   one such member, then the next if it does not answer), restores it
//!   ([`StateTransfer::restore`]) and only then polls its engine: it
//!   delivers nothing before its state, and the others wait for it (their
//!   deliveries need its receive counts). A subgroup none of whose members
//!   was in it before starts empty at the joiner.
//!
//! - **Declarations.** [`ViewMember::declare`] asks to be in a named
//!   subgroup (created if new) through a view change
//!   ([`crate::view`], "Declarations"); the sink learns every view's
//!   catalogue ([`StateTransfer::catalogue`]) before anything of the view
//!   is delivered or restored, and a member newly in a subgroup fetches
//!   its state from the subgroup's other members like a joiner (it holds
//!   none). A declaration is answered ([`MembershipEvent::Answered`]) only
//!   once the view that took it is open — after its `Installed` — so the
//!   sink knows the subgroup and its send handle exists when the caller
//!   hears of it.
//!
//! # Sending across views
//! [`ViewMember::sender`] returns the handle of the current view. A handle
//! of an earlier view answers [`crate::SendError::Wedged`] without calling
//! the build closure: nothing the caller built is lost; it asks for the new
//! handle and sends again. Messages already committed before the wedge are
//! either delivered in the failed view or resent by this member in the next
//! one (ordered subgroups; unordered subgroups deliver on receipt and
//! resend nothing: a message some member did not receive is lost with the
//! view — Derecho's unordered mode promises no failure atomicity either).

use crate::config::{ConfigError, GroupConfig};
use crate::driver::VsyncDriver;
use crate::engine::{Delivered, DeliverySink, Sender};
use crate::layout::GroupLayout;
use crate::view::{
    ControlMsg, Decision, Declaration, DeclarationAnswer, STATE_CHUNK, Status, View, ViewChange, ViewEvent,
    ViewGroup,
};
use ordo_fabric::{Fabric, FailureCause, MemberId};
use std::collections::BTreeMap;

/// The application's state per subgroup, for joiners: a sink that can
/// snapshot and restore what its deliveries built. A plain closure sink
/// has no state to transfer (empty snapshots, restores ignored).
pub trait StateTransfer: DeliverySink {
    /// The state of configured subgroup `subgroup` now (between two views).
    fn snapshot(&mut self, subgroup: usize) -> Vec<u8> {
        let _ = subgroup;
        Vec::new()
    }

    /// Replaces the state of `subgroup` with `state` (a joiner, before it
    /// delivers anything there).
    fn restore(&mut self, subgroup: usize, state: &[u8]) {
        let _ = (subgroup, state);
    }

    /// The catalogue of the view being installed (every subgroup that
    /// exists, configured and declared, in configured order), before
    /// anything of that view is restored or delivered; also once at the
    /// start. A catalogue only grows.
    fn catalogue(&mut self, template: &GroupConfig) {
        let _ = template;
    }
}

impl<F: FnMut(&[Delivered<'_>])> StateTransfer for F {}

/// Snapshots kept to answer joiners (oldest dropped first).
const KEPT_SNAPSHOTS: usize = 16;
/// State chunks sent per request.
const CHUNKS_PER_REQUEST: usize = 4;

/// What happened to this member's view, for the application (view upcalls).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent {
    /// This member wedged: a view change started.
    Wedged {
        /// The view being changed.
        view: u64,
    },
    /// A new view is installed.
    Installed {
        /// The new view.
        view: View,
        /// Members of the previous view that are not in it.
        left: Vec<MemberId>,
        /// Members that joined with it (this member too, if it is one).
        joined: Vec<MemberId>,
        /// Messages delivered in the ragged-edge cleanup.
        ragged: usize,
        /// Own messages resent in the new view.
        resent: usize,
    },
    /// Removed from the group (left out of the next view).
    Removed {
        /// The next view, without this member.
        next: View,
    },
    /// In a minority: stopped for good (partition safety).
    Minority {
        /// The view.
        view: View,
        /// The members it suspected.
        suspects: Vec<MemberId>,
    },
    /// A joiner restored the state of `subgroup` (`bytes` long) and may
    /// deliver there.
    Restored {
        /// The view whose start the state is (the joiner's first view).
        view: u64,
        /// Configured subgroup.
        subgroup: usize,
        /// Bytes of state.
        bytes: usize,
    },
    /// One of this member's declarations is settled (after the view that
    /// took it is open).
    Answered(DeclarationAnswer),
    /// The next view's fabric endpoint could not be opened (a member of it
    /// never came up): this member stops; the others suspect it.
    Failed {
        /// The view it could not install.
        view: View,
        /// Why.
        why: String,
    },
}

/// Makes the fabric endpoint of a view: (the view's group, bytes its
/// region needs) → the endpoint, or why it could not be opened.
pub type OpenResult<F> = Result<F, String>;

/// One member of a vsync group across views. `open` makes the fabric
/// endpoint of a view.
pub struct ViewMember<F: Fabric, O: FnMut(&ViewGroup, usize) -> OpenResult<F>> {
    vc: ViewChange,
    /// None once a view's endpoint could not be opened (stopped).
    driver: Option<VsyncDriver<F>>,
    /// Send handles of the current view, by configured subgroup.
    senders: Vec<Option<Sender>>,
    open: O,
    opening: Option<Opening>,
    /// Snapshots taken for joiners: (joiner's first view, subgroup) → state.
    snapshots: BTreeMap<(u64, usize), Vec<u8>>,
    /// State this joiner still waits for, by configured subgroup.
    awaiting: BTreeMap<usize, Transfer>,
    /// Configured subgroups whose state this member holds (an original
    /// member: those it is configured in; a joiner: those restored).
    holds: std::collections::BTreeSet<usize>,
    /// State-transfer messages to send.
    outbox: Vec<(MemberId, ControlMsg)>,
    patience: u32,
    events: Vec<MembershipEvent>,
    suspicions: Vec<(MemberId, FailureCause)>,
    /// The remapped delivery batch, reused (empty between calls).
    remap_buf: Vec<Delivered<'static>>,
    /// Declaration answers held until the view that gave them is open.
    held: Vec<MembershipEvent>,
}

/// Rewrites engine subgroup indices to configured ones, into a buffer the
/// member keeps (no allocation per delivered batch).
struct Remap<'s, S: ?Sized> {
    sink: &'s mut S,
    configured: &'s [usize],
    buf: &'s mut Vec<Delivered<'static>>,
}

impl<S: DeliverySink + ?Sized> DeliverySink for Remap<'_, S> {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        if batch.iter().all(|d| self.configured[d.subgroup] == d.subgroup) {
            return self.sink.deliver(batch);
        }
        debug_assert!(self.buf.is_empty());
        self.buf.extend(batch.iter().map(|d| {
            // SAFETY: only the payload borrow's lifetime is widened; the
            // entries live in `buf` for the sink call below and are
            // cleared before this returns, so the 'static is never
            // observable (the engine's own delivery batch does the same).
            let d: Delivered<'static> =
                unsafe { std::mem::transmute::<Delivered<'_>, Delivered<'static>>(*d) };
            Delivered { subgroup: self.configured[d.subgroup], ..d }
        }));
        self.sink.deliver(self.buf);
        self.buf.clear();
    }
}

impl<F: Fabric, O: FnMut(&ViewGroup, usize) -> OpenResult<F>> ViewMember<F, O> {
    /// Member `me` of the configured group `template`, starting in `view`.
    pub fn new(me: MemberId, template: GroupConfig, view: View, mut open: O) -> Result<Self, ConfigError> {
        let holds = template
            .subgroups
            .iter()
            .enumerate()
            .filter(|(_, s)| s.members.contains(&me))
            .map(|(g, _)| g)
            .collect();
        let vc = ViewChange::new(me, template, view)?;
        let (driver, senders) = Self::start(&vc, &mut open)?;
        Ok(ViewMember {
            vc,
            driver: Some(driver),
            senders,
            open,
            opening: None,
            snapshots: BTreeMap::new(),
            awaiting: BTreeMap::new(),
            holds,
            outbox: Vec::new(),
            patience: crate::view::DEFAULT_PATIENCE,
            events: Vec::new(),
            suspicions: Vec::new(),
            remap_buf: Vec::new(),
            held: Vec::new(),
        })
    }

    /// Member `me` of the configured group `template`, not in the group: it
    /// asks to join as `incarnation` (unique per start, not 0; the wall
    /// clock in ns does) at every [`tick`](Self::tick) until a view
    /// includes it, then receives its subgroups' state before delivering.
    pub fn join(me: MemberId, template: GroupConfig, incarnation: u64, open: O) -> Result<Self, ConfigError> {
        let vc = ViewChange::joining(me, template, incarnation)?;
        Ok(ViewMember {
            vc,
            driver: None,
            senders: Vec::new(),
            open,
            opening: None,
            snapshots: BTreeMap::new(),
            awaiting: BTreeMap::new(),
            holds: std::collections::BTreeSet::new(),
            outbox: Vec::new(),
            patience: crate::view::DEFAULT_PATIENCE,
            events: Vec::new(),
            suspicions: Vec::new(),
            remap_buf: Vec::new(),
            held: Vec::new(),
        })
    }

    /// Whether this member is still asking to join.
    pub fn is_joining(&self) -> bool {
        self.vc.status() == Status::Joining
    }

    /// Whether this (joined) member still waits for state and so delivers
    /// nothing yet.
    pub fn awaits_state(&self) -> bool {
        !self.awaiting.is_empty()
    }

    fn start(vc: &ViewChange, open: &mut O) -> Result<(VsyncDriver<F>, Vec<Option<Sender>>), ConfigError> {
        let group = vc.group();
        let len = GroupLayout::new(&group.config).region_len;
        let fabric = open(group, len).map_err(|why| ConfigError::Group(format!("{}: {why}", group.view)))?;
        // Views copy: a view's members install it at different times, and a
        // sender may only skip its data writes if every receiver reads in
        // place (zero-copy is for a fixed group, `Switches::zero_copy`).
        let mut config = group.config.clone();
        config.switches.zero_copy = false;
        let (driver, handles) = VsyncDriver::new(fabric, config)?;
        let senders = group.index.iter().map(|i| i.and_then(|i| handles[i].clone())).collect();
        Ok((driver, senders))
    }

    fn drv(&self) -> &VsyncDriver<F> {
        self.driver.as_ref().expect("a running member has a driver")
    }

    /// The current view.
    pub fn view(&self) -> &View {
        self.vc.view()
    }

    /// Ticks without an answer before the member waited on is suspected
    /// (see [`ViewChange::set_patience`]).
    pub fn set_patience(&mut self, ticks: u32) {
        self.vc.set_patience(ticks);
        self.patience = ticks.max(1);
    }

    /// The current view's group (engine configuration, index maps).
    pub fn group(&self) -> &ViewGroup {
        self.vc.group()
    }

    /// Running, removed or in a minority. (A member whose next view could
    /// not be opened reports [`MembershipEvent::Failed`] and is not
    /// [`running`](Self::running), whatever this says.)
    pub fn status(&self) -> Status {
        self.vc.status()
    }

    /// Whether this member still takes part: running, with an endpoint.
    pub fn running(&self) -> bool {
        self.vc.status() == Status::Running && (self.driver.is_some() || self.opening.is_some())
    }

    /// Whether the member runs its view normally: not changing it, and its
    /// endpoint open (its send handles are the view's).
    pub fn is_settled(&self) -> bool {
        self.running() && !self.vc.is_changing() && self.opening.is_none() && self.awaiting.is_empty()
    }

    /// The current view's driver, if its endpoint is open.
    pub fn try_driver(&self) -> Option<&VsyncDriver<F>> {
        self.driver.as_ref()
    }

    /// Whether a view change is under way.
    pub fn is_changing(&self) -> bool {
        self.vc.is_changing()
    }

    /// The send handle of configured subgroup `g` in the current view
    /// (None: not a sender there, or the subgroup is inactive).
    pub fn sender(&self, g: usize) -> Option<&Sender> {
        self.senders.get(g).and_then(|s| s.as_ref())
    }

    /// The current view's driver (engine, stats, backlog). Panics after a
    /// [`MembershipEvent::Failed`].
    pub fn driver(&self) -> &VsyncDriver<F> {
        self.drv()
    }

    /// Control messages to send, as (destination, message).
    pub fn take_outbox(&mut self) -> Vec<(MemberId, ControlMsg)> {
        let mut out = self.vc.take_outbox();
        out.append(&mut self.outbox);
        out
    }

    /// View upcalls since the last call, in order.
    pub fn take_events(&mut self) -> Vec<MembershipEvent> {
        std::mem::take(&mut self.events)
    }

    /// Fabric suspicions since the last call (peer, cause).
    pub fn take_suspicions(&mut self) -> Vec<(MemberId, FailureCause)> {
        std::mem::take(&mut self.suspicions)
    }

    /// One duty cycle: post, poll (if nothing is held back), post, fabric
    /// events (suspicions start a view change). Deliveries go to `sink`.
    pub fn do_work(&mut self, sink: &mut impl StateTransfer) -> usize {
        self.finish_open(sink);
        if !self.running() {
            return 0;
        }
        let driver = self.driver.as_mut().expect("running");
        let mut work = driver.post_backlog();
        // A joiner delivers nothing before its state is restored.
        if driver.can_poll() && self.awaiting.is_empty() {
            let configured = &self.vc.group().configured;
            let mut remap = Remap { sink, configured, buf: &mut self.remap_buf };
            work += driver.poll_engine(&mut remap);
            work += driver.post_backlog();
        }
        let mut suspected = Vec::new();
        work += driver.on_fabric_events(|peer, cause| suspected.push((peer, *cause)));
        for (peer, cause) in suspected {
            // A suspicion may have installed the next view (its endpoint
            // opens at the next call): the rest are the old view's links,
            // and the old engine's counts are no report for the new view
            // (found by the `dds` simulation: a promise with the old view's
            // sender counts made the leader propose a decision that did not
            // fit the view, and panic).
            if !self.running() || self.opening.is_some() {
                break;
            }
            self.suspicions.push((peer, cause));
            let received = self.drv().engine().received_rounds();
            self.vc.suspect(peer, &received);
            work += self.apply(sink);
        }
        work
    }

    /// Asks to be in the named subgroup `d.name` (created if no subgroup
    /// has that name), as a sender if `d.sender`: answered by
    /// [`MembershipEvent::Answered`], with the subgroup's index once a
    /// view's catalogue has it (a view change; at once if it already does)
    /// or with why it is refused.
    pub fn declare(&mut self, d: Declaration, sink: &mut impl StateTransfer) {
        self.finish_open(sink);
        let received = match self.driver.as_ref() {
            Some(drv) if self.running() => drv.engine().received_rounds(),
            _ => Vec::new(),
        };
        self.vc.declare(d, &received);
        self.apply(sink);
    }

    /// The catalogue the current view was allocated from.
    pub fn template(&self) -> &GroupConfig {
        self.vc.template()
    }

    /// Local suspicion from outside the fabric (missed heartbeats).
    pub fn suspect(&mut self, peer: MemberId, sink: &mut impl StateTransfer) {
        self.finish_open(sink);
        if !self.running() {
            return;
        }
        let received = self.drv().engine().received_rounds();
        self.vc.suspect(peer, &received);
        self.apply(sink);
    }

    /// Leaves the group gracefully.
    pub fn leave(&mut self, sink: &mut impl StateTransfer) {
        self.finish_open(sink);
        if !self.running() {
            return;
        }
        let received = self.drv().engine().received_rounds();
        self.vc.leave(&received);
        self.apply(sink);
    }

    /// A control message from `from`.
    pub fn on_control(&mut self, from: MemberId, msg: ControlMsg, sink: &mut impl StateTransfer) -> usize {
        self.finish_open(sink);
        if self.is_joining() {
            self.vc.on_message(from, msg, &[]);
            return self.apply(sink);
        }
        if !self.running() {
            return 0;
        }
        match msg {
            ControlMsg::StateRequest { view, subgroup, offset } => {
                self.answer_state(from, view, subgroup as usize, offset);
                return 1;
            }
            ControlMsg::State { view, subgroup, offset, total, bytes } => {
                return self.on_state(view, subgroup as usize, offset, total, &bytes, sink);
            }
            ControlMsg::NoState { view, subgroup } => {
                return self.on_no_state(from, view, subgroup as usize, sink);
            }
            _ => {}
        }
        let received = self.drv().engine().received_rounds();
        self.vc.on_message(from, msg, &received);
        self.apply(sink)
    }

    /// Retransmissions; call periodically.
    pub fn tick(&mut self, sink: &mut impl StateTransfer) {
        self.finish_open(sink);
        if self.is_joining() {
            self.vc.tick(&[]);
            self.apply(sink);
            return;
        }
        if !self.running() {
            return;
        }
        self.request_state();
        let received = self.drv().engine().received_rounds();
        self.vc.tick(&received);
        self.apply(sink);
    }

    /// Carries out what the view change asked for, in order.
    fn apply(&mut self, sink: &mut impl StateTransfer) -> usize {
        let mut work = 0;
        for e in self.vc.take_events() {
            work += 1;
            match e {
                ViewEvent::Wedge => {
                    if let Some(d) = self.driver.as_mut() {
                        d.wedge();
                    }
                    self.events.push(MembershipEvent::Wedged { view: self.vc.view().id });
                }
                ViewEvent::Install { old, decision } => self.install(old, &decision, sink),
                ViewEvent::Joined { .. } => {
                    let me = self.vc.member();
                    self.opening =
                        Some(Opening { old: None, ragged: 0, resend: Vec::new(), joined: vec![me] });
                }
                ViewEvent::Removed { next, .. } => {
                    if let Some(d) = self.driver.as_mut() {
                        d.wedge();
                    }
                    self.events.push(MembershipEvent::Removed { next });
                }
                ViewEvent::Minority { view, suspects } => {
                    if let Some(d) = self.driver.as_mut() {
                        d.wedge();
                    }
                    self.events.push(MembershipEvent::Minority { view, suspects });
                }
                ViewEvent::Answered(a) => self.answer(MembershipEvent::Answered(a)),
            }
        }
        work
    }

    /// Reports a declaration's answer: at once, or — while the view that
    /// gave it is not open yet — after its `Installed`.
    fn answer(&mut self, e: MembershipEvent) {
        if self.opening.is_some() {
            self.held.push(e);
        } else {
            self.events.push(e);
        }
    }

    /// The decided view's first half: the failed view's ragged edge is
    /// delivered, this member's messages to resend are collected (the old
    /// engine stays wedged), and, if members join, the state of every
    /// subgroup they join is snapshot here — after the ragged edge, before
    /// anything of the new view. The old endpoint is closed and the new one
    /// opened by `finish_open` at the start of the next call, once the
    /// caller has sent the outbox: opening waits for the other members, who
    /// must first learn the decision.
    fn install(&mut self, old: ViewGroup, decision: &Decision, sink: &mut impl StateTransfer) {
        let driver = self.driver.as_mut().expect("a running member has a driver");
        driver.wedge();
        let ragged = {
            let mut remap = Remap { sink, configured: &old.configured, buf: &mut self.remap_buf };
            driver.deliver_ragged(&decision.trims, &mut remap)
        };
        let resend: Vec<(usize, Vec<u8>)> = driver
            .engine()
            .undelivered_own(&decision.trims)
            .into_iter()
            .map(|(g, bytes)| (old.configured[g], bytes))
            .collect();
        let joiners = decision.joiners(&old.view);
        // Every member that holds an active subgroup snapshots it at the
        // install, after the failed view's ragged edge: whoever in it lacks
        // the state (a joiner, a member of a subgroup that was inactive, a
        // joiner still waiting from an earlier view) fetches this one.
        let me = self.vc.member();
        let new = self.vc.group().clone();
        for (g, is) in new.index.iter().enumerate() {
            let Some(is) = is else { continue };
            let members = &new.config.subgroups[*is].members;
            if members.contains(&me) && self.holds.contains(&g) && members.len() > 1 {
                let state = sink.snapshot(g);
                self.snapshots.insert((decision.next.id, g), state);
                while self.snapshots.len() > KEPT_SNAPSHOTS {
                    let first = *self.snapshots.keys().next().expect("non-empty");
                    self.snapshots.remove(&first);
                }
            }
        }
        self.senders.iter_mut().for_each(|s| *s = None);
        self.opening = Some(Opening { old: Some(old), ragged, resend, joined: joiners });
    }

    /// Opens the installed view's endpoint if it is pending: builds its
    /// engine, resends, acknowledges, reports [`MembershipEvent::Installed`]
    /// (or [`MembershipEvent::Failed`]); a joiner starts waiting for its
    /// state. Every entry point calls it first.
    fn finish_open(&mut self, sink: &mut impl StateTransfer) {
        let Some(Opening { old, ragged, resend, joined }) = self.opening.take() else { return };
        // The old view's endpoint closes first (a tcp backend frees its
        // port) — only now, after the caller sent the decision: a peer that
        // sees the old links close suspects this member, and must learn the
        // decision rather than count the closing as a failure.
        self.driver = None;
        sink.catalogue(self.vc.template());
        match Self::start(&self.vc, &mut self.open) {
            Ok((driver, senders)) => {
                self.driver = Some(driver);
                self.senders = senders;
            }
            Err(e) => {
                self.events
                    .push(MembershipEvent::Failed { view: self.vc.view().clone(), why: e.to_string() });
                return;
            }
        }
        for (g, bytes) in &resend {
            let handle =
                self.senders[*g].as_ref().expect("a surviving sender sends in its subgroup's next view");
            handle
                .try_send_with(bytes.len(), |buf| buf.copy_from_slice(bytes))
                .expect("resends fit in the new view's empty ring (at most a window of them)");
        }
        let me = self.vc.member();
        let view = self.vc.view().clone();
        // Every active subgroup of this member whose state it does not hold
        // (it joined, or the subgroup was inactive when it joined) waits for
        // it from the subgroup's other members.
        let group = self.vc.group().clone();
        // A transfer for a subgroup inactive in (or without this member in)
        // the new view waits no more: if the subgroup comes back with this
        // member in it, its holders snapshot it then.
        self.awaiting
            .retain(|g, _| group.index[*g].is_some_and(|i| group.config.subgroups[i].members.contains(&me)));
        for (g, i) in group.index.iter().enumerate() {
            let Some(i) = i else { continue };
            let members = &group.config.subgroups[*i].members;
            if !members.contains(&me) || self.holds.contains(&g) {
                continue;
            }
            let sources: Vec<MemberId> = members.iter().copied().filter(|m| *m != me).collect();
            if let Some(t) = self.awaiting.get_mut(&g) {
                if !sources.is_empty() {
                    t.sources = sources;
                    if t.buf.is_empty() {
                        // Nothing fetched yet: ask for the state at this
                        // view's start, which every holder just took.
                        t.view = view.id;
                        t.refused.clear();
                    }
                    continue;
                }
                // Every other member of the subgroup is gone: its state
                // went with them.
                self.awaiting.remove(&g);
            }
            if sources.is_empty() {
                sink.restore(g, &[]);
                self.holds.insert(g);
                self.snapshots.insert((view.id, g), Vec::new());
                self.events.push(MembershipEvent::Restored { view: view.id, subgroup: g, bytes: 0 });
                continue;
            }
            let t = Transfer {
                view: view.id,
                sources,
                next: 0,
                idle: 0,
                buf: Vec::new(),
                total: None,
                refused: Default::default(),
            };
            self.awaiting.insert(g, t);
        }
        if !self.awaiting.is_empty() {
            self.request_state();
        }
        self.vc.installed();
        let left = old
            .map(|o| o.view.members.iter().copied().filter(|m| !view.contains(*m)).collect())
            .unwrap_or_default();
        self.events.push(MembershipEvent::Installed { view, left, joined, ragged, resent: resend.len() });
        self.events.append(&mut self.held);
    }

    /// A joiner asks the next source of each subgroup it waits for; a
    /// source silent for a patience is skipped.
    fn request_state(&mut self) {
        for (&g, t) in self.awaiting.iter_mut() {
            t.idle += 1;
            if t.idle > self.patience {
                t.idle = 0;
                t.next += 1;
            }
            let to = t.sources[t.next % t.sources.len()];
            let msg =
                ControlMsg::StateRequest { view: t.view, subgroup: g as u32, offset: t.buf.len() as u64 };
            self.outbox.push((to, msg));
        }
    }

    /// Sends up to a few chunks of a snapshot to a joiner that asked (or
    /// says it holds no state of that subgroup).
    fn answer_state(&mut self, to: MemberId, view: u64, g: usize, offset: u64) {
        let Some(state) = self.snapshots.get(&(view, g)) else {
            if !self.holds.contains(&g) {
                self.outbox.push((to, ControlMsg::NoState { view, subgroup: g as u32 }));
            }
            return;
        };
        let total = state.len() as u64;
        let mut at = offset.min(total) as usize;
        for _ in 0..CHUNKS_PER_REQUEST {
            let end = (at + STATE_CHUNK).min(state.len());
            let bytes = state[at..end].to_vec();
            self.outbox
                .push((to, ControlMsg::State { view, subgroup: g as u32, offset: at as u64, total, bytes }));
            at = end;
            if at >= state.len() {
                break;
            }
        }
    }

    /// A source holds no state of `g`: once every source said so, no holder
    /// is left and this member starts `g` empty.
    fn on_no_state(&mut self, from: MemberId, view: u64, g: usize, sink: &mut impl StateTransfer) -> usize {
        let Some(t) = self.awaiting.get_mut(&g) else { return 0 };
        if t.view != view || !t.buf.is_empty() {
            return 0;
        }
        t.refused.insert(from);
        t.next += 1;
        t.idle = 0;
        if t.sources.iter().all(|s| t.refused.contains(s)) {
            self.awaiting.remove(&g);
            sink.restore(g, &[]);
            self.holds.insert(g);
            // Others waiting for the same state get the same (empty) one.
            self.snapshots.insert((view, g), Vec::new());
            self.events.push(MembershipEvent::Restored { view, subgroup: g, bytes: 0 });
        }
        1
    }

    /// A chunk of state for this joiner: appended if it is the next one;
    /// once whole, restored, and the subgroup may deliver.
    fn on_state(
        &mut self,
        view: u64,
        g: usize,
        offset: u64,
        total: u64,
        bytes: &[u8],
        sink: &mut impl StateTransfer,
    ) -> usize {
        let Some(t) = self.awaiting.get_mut(&g) else { return 0 };
        if t.view != view || offset != t.buf.len() as u64 || t.total.is_some_and(|x| x != total) {
            return 0;
        }
        t.buf.extend_from_slice(bytes);
        t.total = Some(total);
        t.idle = 0;
        if t.buf.len() as u64 >= total {
            let t = self.awaiting.remove(&g).expect("present");
            sink.restore(g, &t.buf);
            self.holds.insert(g);
            self.events.push(MembershipEvent::Restored { view: t.view, subgroup: g, bytes: t.buf.len() });
            // It can serve other joiners waiting for the same state.
            self.snapshots.insert((t.view, g), t.buf);
        }
        1
    }
}

/// A subgroup's state a joiner is fetching.
struct Transfer {
    /// The joiner's first view (the snapshot's key).
    view: u64,
    /// Members that may hold the snapshot, asked in turn.
    sources: Vec<MemberId>,
    next: usize,
    /// Ticks since the last chunk.
    idle: u32,
    buf: Vec<u8>,
    total: Option<u64>,
    /// Sources that said they hold no state of the subgroup.
    refused: std::collections::BTreeSet<MemberId>,
}

/// A decided view whose endpoint is not open yet.
struct Opening {
    /// The failed view (None: this member joined).
    old: Option<ViewGroup>,
    ragged: usize,
    resend: Vec<(usize, Vec<u8>)>,
    /// Members that joined with the view.
    joined: Vec<MemberId>,
}
