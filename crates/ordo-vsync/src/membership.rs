//! A vsync member across views: the view change ([`crate::view`]) driving
//! one [`VsyncDriver`] per view — everything a member does except threads,
//! sockets and clocks. The seeded simulation (`ordo sim --workload
//! vsync-views`) drives this type; so will the member daemon.
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
use crate::view::{ControlMsg, Decision, Status, View, ViewChange, ViewEvent, ViewGroup};
use ordo_fabric::{Fabric, FailureCause, MemberId};

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
    events: Vec<MembershipEvent>,
    suspicions: Vec<(MemberId, FailureCause)>,
}

/// Rewrites engine subgroup indices to configured ones.
struct Remap<'s, S: ?Sized> {
    sink: &'s mut S,
    configured: &'s [usize],
}

impl<S: DeliverySink + ?Sized> DeliverySink for Remap<'_, S> {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        if batch.iter().all(|d| self.configured[d.subgroup] == d.subgroup) {
            return self.sink.deliver(batch);
        }
        let mut out: Vec<Delivered<'_>> = Vec::with_capacity(batch.len());
        out.extend(batch.iter().map(|d| Delivered { subgroup: self.configured[d.subgroup], ..*d }));
        self.sink.deliver(&out);
    }
}

impl<F: Fabric, O: FnMut(&ViewGroup, usize) -> OpenResult<F>> ViewMember<F, O> {
    /// Member `me` of the configured group `template`, starting in `view`.
    pub fn new(me: MemberId, template: GroupConfig, view: View, mut open: O) -> Result<Self, ConfigError> {
        let vc = ViewChange::new(me, template, view)?;
        let (driver, senders) = Self::start(&vc, &mut open)?;
        Ok(ViewMember {
            vc,
            driver: Some(driver),
            senders,
            open,
            opening: None,
            events: Vec::new(),
            suspicions: Vec::new(),
        })
    }

    fn start(vc: &ViewChange, open: &mut O) -> Result<(VsyncDriver<F>, Vec<Option<Sender>>), ConfigError> {
        let group = vc.group();
        let len = GroupLayout::new(&group.config).region_len;
        let fabric = open(group, len).map_err(|why| ConfigError::Group(format!("{}: {why}", group.view)))?;
        let (driver, handles) = VsyncDriver::new(fabric, group.config.clone())?;
        let senders = group.index.iter().map(|i| i.and_then(|i| handles[i].clone())).collect();
        Ok((driver, senders))
    }

    fn drv(&self) -> &VsyncDriver<F> {
        self.driver.as_ref().expect("a running member has a driver")
    }

    fn drv_mut(&mut self) -> &mut VsyncDriver<F> {
        self.driver.as_mut().expect("a running member has a driver")
    }

    /// The current view.
    pub fn view(&self) -> &View {
        self.vc.view()
    }

    /// Ticks without an answer before the member waited on is suspected
    /// (see [`ViewChange::set_patience`]).
    pub fn set_patience(&mut self, ticks: u32) {
        self.vc.set_patience(ticks);
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
        self.running() && !self.vc.is_changing() && self.opening.is_none()
    }

    /// The current view's driver, if its endpoint is open.
    pub fn try_driver(&self) -> Option<&VsyncDriver<F>> {
        self.driver.as_ref()
    }

    /// Whether a view change is under way.
    pub fn is_changing(&self) -> bool {
        self.vc.is_changing()
    }

    /// Whether [`tick`](Self::tick) has retransmissions to make.
    pub fn has_pending(&self) -> bool {
        self.running() && self.vc.has_pending()
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
        self.vc.take_outbox()
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
    pub fn do_work(&mut self, sink: &mut impl DeliverySink) -> usize {
        self.finish_open();
        if !self.running() {
            return 0;
        }
        let driver = self.driver.as_mut().expect("running");
        let mut work = driver.post_backlog();
        if driver.can_poll() {
            let configured = &self.vc.group().configured;
            let mut remap = Remap { sink, configured };
            work += driver.poll_engine(&mut remap);
            work += driver.post_backlog();
        }
        let mut suspected = Vec::new();
        work += driver.on_fabric_events(|peer, cause| suspected.push((peer, *cause)));
        for (peer, cause) in suspected {
            if !self.running() {
                break;
            }
            self.suspicions.push((peer, cause));
            let received = self.drv().engine().received_rounds();
            self.vc.suspect(peer, &received);
            work += self.apply(sink);
        }
        work
    }

    /// Local suspicion from outside the fabric (missed heartbeats).
    pub fn suspect(&mut self, peer: MemberId, sink: &mut impl DeliverySink) {
        self.finish_open();
        if !self.running() {
            return;
        }
        let received = self.drv().engine().received_rounds();
        self.vc.suspect(peer, &received);
        self.apply(sink);
    }

    /// Leaves the group gracefully.
    pub fn leave(&mut self, sink: &mut impl DeliverySink) {
        self.finish_open();
        if !self.running() {
            return;
        }
        let received = self.drv().engine().received_rounds();
        self.vc.leave(&received);
        self.apply(sink);
    }

    /// A control message from `from`.
    pub fn on_control(&mut self, from: MemberId, msg: ControlMsg, sink: &mut impl DeliverySink) -> usize {
        self.finish_open();
        if !self.running() {
            return 0;
        }
        let received = self.drv().engine().received_rounds();
        self.vc.on_message(from, msg, &received);
        self.apply(sink)
    }

    /// Retransmissions; call periodically.
    pub fn tick(&mut self, sink: &mut impl DeliverySink) {
        self.finish_open();
        if !self.running() {
            return;
        }
        let received = self.drv().engine().received_rounds();
        self.vc.tick(&received);
        self.apply(sink);
    }

    /// Carries out what the view change asked for, in order.
    fn apply(&mut self, sink: &mut impl DeliverySink) -> usize {
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
            }
        }
        work
    }

    /// The decided view's first half: the failed view's ragged edge is
    /// delivered and this member's messages to resend are collected (the
    /// old engine stays wedged). The old endpoint is closed and the new one
    /// opened by [`finish_open`](Self::finish_open) at the start of the
    /// next call, once the caller has sent the outbox: opening waits for
    /// the other members, who must first learn the decision.
    fn install(&mut self, old: ViewGroup, decision: &Decision, sink: &mut impl DeliverySink) {
        let driver = self.drv_mut();
        driver.wedge();
        let ragged = {
            let mut remap = Remap { sink, configured: &old.configured };
            driver.deliver_ragged(&decision.trims, &mut remap)
        };
        let resend: Vec<(usize, Vec<u8>)> = driver
            .engine()
            .undelivered_own(&decision.trims)
            .into_iter()
            .map(|(g, bytes)| (old.configured[g], bytes))
            .collect();
        self.senders.iter_mut().for_each(|s| *s = None);
        self.opening = Some(Opening { old, ragged, resend });
    }

    /// Opens the installed view's endpoint if it is pending: builds its
    /// engine, resends, acknowledges, reports [`MembershipEvent::Installed`]
    /// (or [`MembershipEvent::Failed`]). Every other entry point calls it
    /// first.
    pub fn finish_open(&mut self) {
        let Some(Opening { old, ragged, resend }) = self.opening.take() else { return };
        // The old view's endpoint closes first (a tcp backend frees its
        // port) — only now, after the caller sent the decision: a peer that
        // sees the old links close suspects this member, and must learn the
        // decision rather than count the closing as a failure.
        self.driver = None;
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
        self.vc.installed();
        let view = self.vc.view().clone();
        let left = old.view.members.iter().copied().filter(|m| !view.contains(*m)).collect();
        self.events.push(MembershipEvent::Installed { view, left, ragged, resent: resend.len() });
    }
}

/// A decided view whose endpoint is not open yet.
struct Opening {
    old: ViewGroup,
    ragged: usize,
    resend: Vec<(usize, Vec<u8>)>,
}
