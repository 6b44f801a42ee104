//! Virtual synchrony: the view-change protocol of a vsync group, sans-I/O
//! (spindle §II-A; Derecho's view change, reworked as a single-decree Paxos
//! per view).
//!
//! A **view** is a numbered list of members in rank order. When a member is
//! suspected (a fabric timeout, a missed heartbeat, an explicit leave) the
//! group moves to view `id + 1` without it. The protocol decides, once per
//! view, a [`Decision`]: the next view and the **ragged trim** — per
//! subgroup and sender, how many rounds of the failed view every survivor
//! delivers. Messages past the trim are delivered by nobody in the failed
//! view; their senders, if they survive, resend them in the next one.
//!
//! # The protocol (messages are [`ControlMsg`]; transport: the control plane)
//! 1. **Suspicion.** A member that suspects a peer adds it to its suspects,
//!    **wedges** (its engine stops sending, receiving and delivering, so its
//!    received counts freeze) and tells every member of the view
//!    (`Suspect`). A member adopts every suspicion it hears of.
//! 2. **Prepare.** The **view leader** — the lowest-ranked member it does not
//!    suspect — picks a ballot above any it has seen and sends `Prepare`.
//!    A member that has promised nothing higher wedges and answers `Promise`
//!    with its frozen received counts, its suspects, and the decision it
//!    accepted in this view, if any; else `Nack`.
//! 3. **Decide.** With a promise from every member it does not suspect (a
//!    majority of the view at least), the leader proposes the decision of
//!    the highest ballot any promise carried (a leader that died during the
//!    change is replaced and its cleanup finished), or else a fresh one:
//!    next view = the unsuspected members that promised, in rank order;
//!    trim = per subgroup and sender the minimum of their received counts.
//! 4. **Accept.** `Accept` to the members of the next view; each accepts
//!    unless it promised a higher ballot. With every unsuspected member of
//!    the next view accepted (a majority of the view at least) the decision
//!    is chosen: `Commit` to every member of the view.
//! 5. **Install.** A member that learns the decision delivers the ragged
//!    edge (`Engine::deliver_ragged`), collects its own messages to resend
//!    (`Engine::undelivered_own`) and installs the next view (a new SST and
//!    ring layout); it answers `Installed`. A member left out of the next
//!    view is **removed** and stops. The leader resends `Commit` until every
//!    unsuspected member of the next view answered.
//!
//! 6. **Joins.** A configured member that is not in the group (new, or a
//!    restarted member: a new incarnation) sends `Join` to every configured
//!    member; any member that hears it wedges, and the leader's next
//!    decision appends the joiners (with their incarnations) to the next
//!    view. A `Join` from a new incarnation of a member still in the view
//!    first has the old one suspected and removed. Joiners are told the
//!    commit (`Commit` goes to them too) and then fetch their state (see
//!    [`crate::ViewMember`]); they are not acceptors of the view they join.
//! 7. **Declarations** (subgroups created at run time, spindle §IV-F: a
//!    DDS topic is a subgroup of its publishers and subscribers, created as
//!    participants declare it). A member of the view that wants to be in a
//!    named subgroup — as a sender or not; creating it if no subgroup has
//!    that name — sends `Declare` to every member of the view, every tick
//!    until an installed view's catalogue says it is in (or refuses it: the
//!    name is taken with another shape, or the catalogue is full). Any
//!    member that hears a pending declaration wedges, and the leader's next
//!    fresh decision carries the **catalogue** (every subgroup: name,
//!    shape, members, senders) with the declarations it heard applied
//!    ([`apply_declaration`]). Every decision carries the whole catalogue,
//!    so members and joiners install the same one; a catalogue only grows
//!    (subgroups are appended, members and senders are appended to theirs),
//!    so a configured subgroup index names the same subgroup for ever. A
//!    member newly in a subgroup fetches its state like a joiner.
//! 8. **One leader at a time, in practice.** Members may disagree on whom
//!    they trust (reported suspicions differ; two may suspect each other),
//!    so several may think they lead. Every ballot is sent to every other
//!    member, and a member that hears a lower-ranked one running ballots
//!    stops competing for two patiences after the last one it heard; a
//!    member waiting for a leader suspects it after three.
//!
//! # Invariants
//! - **Agreement.** At most one decision is chosen per view (Paxos: a
//!   chosen decision was accepted by a majority of the view, every later
//!   ballot's promise quorum — a majority too — meets it, and a leader
//!   proposes the highest accepted decision it hears of). Every member that
//!   installs view `v + 1` installs the same one.
//! - **Partition safety** (on, always): a leader needs promises and accepts
//!   from a majority of the view; a member whose unsuspected members are no
//!   majority leads nothing and, unless a decision reaches it within its
//!   patience, stops with [`ViewEvent::Minority`] and never installs a view.
//! - **The trim is safe to deliver.** Every member of the next view promised
//!   received counts at least the trim (the trim is their minimum; counts
//!   are frozen at the wedge and reported after it), so every survivor
//!   holds every message it must deliver.
//! - **Nothing delivered beyond the trim.** Any member delivered only
//!   messages every member had received, as advertised in the SST; a
//!   wedged member advertises no more than it reports, so everything any
//!   member (alive or not) delivered in the view is within the trim of every
//!   later decision: survivors deliver a superset of what anyone delivered.
//! - Messages of another view are answered (a straggler gets the `Commit`
//!   of its view) or dropped, never applied to this one. Decoded messages
//!   are bounded ([`MAX_MEMBERS`], [`MAX_SUBGROUPS`], [`MAX_SENDERS`]);
//!   a malformed frame is a [`DecodeError`] and changes nothing.
//! - **One catalogue per view.** Every member of a view allocates it from
//!   the catalogue of the decision that made it (or, for view 0, the
//!   configured one), so all agree on its subgroups; each decision's
//!   catalogue extends the view's ([`extends`]); its encoding stays within
//!   [`MAX_CATALOGUE_BYTES`].

use crate::config::{
    ConfigError, DeliveryMode, GroupConfig, MAX_DESCRIPTOR, MAX_NAME, MAX_PAYLOAD, MAX_WINDOW, SubgroupConfig,
};
use ordo_fabric::MemberId;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Most members a view may have (a bound of the decoder).
pub const MAX_MEMBERS: usize = 1024;
/// Most subgroups a decision may carry trims for.
pub const MAX_SUBGROUPS: usize = 1024;
/// Most senders a subgroup may have.
pub const MAX_SENDERS: usize = 1024;
/// Decisions kept to answer stragglers of earlier views.
pub const KEPT_DECISIONS: usize = 16;
/// Most bytes a catalogue may take in a decision (a declaration that would
/// grow it beyond is refused): a decision, with its trims, fits one control
/// frame.
pub const MAX_CATALOGUE_BYTES: usize = 16 * 1024;
/// Pending declarations a member keeps per declaring member (more are
/// dropped; the declarer re-sends them in the next view).
pub const MAX_DECLARATIONS: usize = 16;

/// A view: its number and its members in rank order (rank 0 leads).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct View {
    /// The view number; the first view is 0.
    pub id: u64,
    /// Members, in rank order.
    pub members: Vec<MemberId>,
}

impl View {
    /// Members needed for a majority of this view.
    pub fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }

    /// Whether `m` is a member.
    pub fn contains(&self, m: MemberId) -> bool {
        self.members.contains(&m)
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "view {} {:?}", self.id, self.members)
    }
}

/// A Paxos ballot: a round, then the proposing leader (ties broken by id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ballot {
    /// The round.
    pub round: u64,
    /// The leader that proposes under it.
    pub leader: MemberId,
}

/// What a view change decides.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// The next view.
    pub next: View,
    /// Per subgroup of the failed view (its engine's indices) and sender
    /// rank: rounds every survivor delivers. Empty for a subgroup with no
    /// survivor.
    pub trims: Vec<Vec<u64>>,
    /// The incarnation of each member of `next` (same order): 0 for the
    /// first incarnation, the joiner's own number for a member that joined.
    /// A member of `next` not in the failed view is a **joiner**.
    pub incarnations: Vec<u64>,
    /// The catalogue of the next view: every subgroup that exists, in
    /// configured order (the failed view's catalogue with the declarations
    /// the leader heard applied).
    pub subgroups: Vec<SubgroupConfig>,
}

/// A member's request to be in the subgroup called `name` (created if no
/// subgroup has that name), with the shape it expects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Declaration {
    /// The subgroup's name (1..=[`MAX_NAME`] bytes).
    pub name: String,
    /// The application's description of it (at most [`MAX_DESCRIPTOR`]).
    pub descriptor: Vec<u8>,
    /// Slots per sender ring.
    pub window: usize,
    /// Largest message payload.
    pub max_payload: usize,
    /// Delivery mode.
    pub mode: DeliveryMode,
    /// Whether the member sends there (else it only receives).
    pub sender: bool,
}

impl Declaration {
    /// A declaration of subgroup `s`'s name and shape (its members aside),
    /// as a sender or not.
    pub fn of(s: &SubgroupConfig, sender: bool) -> Declaration {
        Declaration {
            name: s.name.clone(),
            descriptor: s.descriptor.clone(),
            window: s.window,
            max_payload: s.max_payload,
            mode: s.mode,
            sender,
        }
    }

    /// Whether the declaration itself is well formed.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > MAX_NAME {
            return Err(format!("a subgroup name has 1..={MAX_NAME} bytes"));
        }
        if self.descriptor.len() > MAX_DESCRIPTOR {
            return Err(format!("a descriptor has at most {MAX_DESCRIPTOR} bytes"));
        }
        if self.window == 0 || self.window > MAX_WINDOW {
            return Err(format!("window {} must be in 1..={MAX_WINDOW}", self.window));
        }
        if self.max_payload == 0 || self.max_payload > MAX_PAYLOAD {
            return Err(format!("max_payload {} must be in 1..={MAX_PAYLOAD}", self.max_payload));
        }
        Ok(())
    }

    /// Whether subgroup `s` has the shape this declaration expects.
    fn agrees(&self, s: &SubgroupConfig) -> bool {
        s.window == self.window
            && s.max_payload == self.max_payload
            && s.mode == self.mode
            && s.descriptor == self.descriptor
    }
}

/// Where a declaration stands in a catalogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Declared {
    /// The member is in the subgroup (a sender if it asked to be): its
    /// configured index.
    In(usize),
    /// Not yet.
    Pending,
    /// It never will be: why.
    Refused(String),
}

/// Where `member`'s declaration `d` stands in `template`.
pub fn declaration_status(template: &GroupConfig, member: MemberId, d: &Declaration) -> Declared {
    if let Err(why) = d.check() {
        return Declared::Refused(why);
    }
    if !template.members.contains(&member) {
        return Declared::Refused(format!("member {member} is not configured"));
    }
    match template.subgroups.iter().position(|s| s.name == d.name) {
        Some(g) => {
            let s = &template.subgroups[g];
            if !d.agrees(s) {
                Declared::Refused(format!(
                    "subgroup {:?} exists with another shape (window {}, max_payload {}, {:?}, descriptor of {} bytes)",
                    d.name,
                    s.window,
                    s.max_payload,
                    s.mode,
                    s.descriptor.len()
                ))
            } else if s.members.contains(&member) && (!d.sender || s.senders.contains(&member)) {
                Declared::In(g)
            } else if s.members.len() >= MAX_MEMBERS {
                Declared::Refused(format!("subgroup {:?} is full", d.name))
            } else {
                Declared::Pending
            }
        }
        None if template.subgroups.len() >= MAX_SUBGROUPS => {
            Declared::Refused(format!("the group has {MAX_SUBGROUPS} subgroups"))
        }
        None => Declared::Pending,
    }
}

/// Applies `member`'s declaration to `template` if it is pending there and
/// the catalogue stays within [`MAX_CATALOGUE_BYTES`]: appends the subgroup
/// (the member its only member) or the member to it. Returns whether the
/// catalogue changed. Deterministic: every leader applies the same
/// declarations in the same order to the same catalogue alike.
pub fn apply_declaration(template: &mut GroupConfig, member: MemberId, d: &Declaration) -> bool {
    if declaration_status(template, member, d) != Declared::Pending {
        return false;
    }
    let before = template.subgroups.clone();
    match template.subgroups.iter_mut().find(|s| s.name == d.name) {
        Some(s) => {
            if !s.members.contains(&member) {
                s.members.push(member);
            }
            if d.sender && !s.senders.contains(&member) {
                s.senders.push(member);
            }
        }
        None => template.subgroups.push(SubgroupConfig {
            members: vec![member],
            senders: if d.sender { vec![member] } else { Vec::new() },
            window: d.window,
            max_payload: d.max_payload,
            mode: d.mode,
            name: d.name.clone(),
            descriptor: d.descriptor.clone(),
        }),
    }
    if catalogue_len(&template.subgroups) > MAX_CATALOGUE_BYTES {
        template.subgroups = before;
        return false;
    }
    true
}

/// Bytes `subgroups` take in a decision.
pub fn catalogue_len(subgroups: &[SubgroupConfig]) -> usize {
    let mut out = Vec::new();
    Writer(&mut out).catalogue(subgroups);
    out.len()
}

/// Whether catalogue `new` extends `old`: every subgroup of `old` is in
/// `new` at the same index with the same shape, its members and senders
/// first in the same order; later subgroups are new. (A catalogue only
/// grows: a configured index names one subgroup for ever.)
pub fn extends(old: &[SubgroupConfig], new: &[SubgroupConfig]) -> bool {
    new.len() >= old.len()
        && old.iter().zip(new).all(|(a, b)| {
            a.name == b.name
                && a.same_shape(b)
                && b.members.starts_with(&a.members)
                && b.senders.starts_with(&a.senders)
        })
}

impl Decision {
    /// Members of the next view that were not in `old` (joiners).
    pub fn joiners(&self, old: &View) -> Vec<MemberId> {
        self.next.members.iter().copied().filter(|m| !old.contains(*m)).collect()
    }

    /// The incarnation of `m` in the next view.
    pub fn incarnation_of(&self, m: MemberId) -> Option<u64> {
        self.next.members.iter().position(|x| *x == m).map(|i| self.incarnations[i])
    }
}

/// A control-plane message of the view change (see the module docs).
/// `view` is the number of the view being changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlMsg {
    /// The sender suspects these members.
    Suspect {
        /// View.
        view: u64,
        /// Suspected members.
        suspects: Vec<MemberId>,
    },
    /// Phase 1a.
    Prepare {
        /// View.
        view: u64,
        /// The leader's ballot.
        ballot: Ballot,
    },
    /// Phase 1b.
    Promise {
        /// View.
        view: u64,
        /// The ballot promised.
        ballot: Ballot,
        /// The decision accepted in this view, with its ballot.
        accepted: Option<(Ballot, Decision)>,
        /// Frozen rounds received, per subgroup and sender rank.
        received: Vec<Vec<u64>>,
        /// Members the sender suspects.
        suspects: Vec<MemberId>,
    },
    /// A ballot refused: the sender promised `promised`.
    Nack {
        /// View.
        view: u64,
        /// The higher ballot promised.
        promised: Ballot,
    },
    /// Phase 2a.
    Accept {
        /// View.
        view: u64,
        /// The leader's ballot.
        ballot: Ballot,
        /// The proposed decision.
        decision: Decision,
    },
    /// Phase 2b.
    Accepted {
        /// View.
        view: u64,
        /// The ballot accepted.
        ballot: Ballot,
    },
    /// The decision of view `view` is chosen.
    Commit {
        /// View.
        view: u64,
        /// The decision.
        decision: Decision,
    },
    /// The sender installed the decision of view `view`.
    Installed {
        /// View.
        view: u64,
    },
    /// The sender is alive in view `view` (sent every few ticks; a member
    /// silent for too long is suspected).
    Heartbeat {
        /// View.
        view: u64,
    },
    /// A configured member that is not in the group (new, or restarted as
    /// a new incarnation) asks to join; sent to every configured member
    /// until a commit includes it. `view` is 0.
    Join {
        /// Always 0 (the joiner is in no view).
        view: u64,
        /// The joiner's incarnation (unique per start, never 0).
        incarnation: u64,
    },
    /// A chunk of the state of `subgroup` at the start of view `view`
    /// (the joiner's first view), for a joiner.
    State {
        /// The joiner's first view.
        view: u64,
        /// Configured subgroup.
        subgroup: u32,
        /// Offset of this chunk.
        offset: u64,
        /// Bytes of the whole state.
        total: u64,
        /// The chunk (at most [`STATE_CHUNK`] bytes).
        bytes: Vec<u8>,
    },
    /// The answer of a member that does not hold the state of `subgroup`
    /// (it joined after it, too): a joiner whose every source says so
    /// starts with an empty state (no holder is left).
    NoState {
        /// The joiner's first view.
        view: u64,
        /// Configured subgroup.
        subgroup: u32,
    },
    /// The sender asks to be in a named subgroup (see the module docs);
    /// re-sent every tick until the view's catalogue has it.
    Declare {
        /// View.
        view: u64,
        /// What it asks for.
        declaration: Declaration,
    },
    /// A joiner asks for the state of `subgroup` at the start of view
    /// `view`, from `offset`.
    StateRequest {
        /// The joiner's first view.
        view: u64,
        /// Configured subgroup.
        subgroup: u32,
        /// First byte wanted.
        offset: u64,
    },
}

/// Largest state chunk in one [`ControlMsg::State`].
pub const STATE_CHUNK: usize = 32 * 1024;
/// Largest state a joiner accepts for one subgroup.
pub const MAX_STATE: u64 = 256 << 20;

impl ControlMsg {
    /// The view this message is about.
    pub fn view(&self) -> u64 {
        match self {
            ControlMsg::Suspect { view, .. }
            | ControlMsg::Prepare { view, .. }
            | ControlMsg::Promise { view, .. }
            | ControlMsg::Nack { view, .. }
            | ControlMsg::Accept { view, .. }
            | ControlMsg::Accepted { view, .. }
            | ControlMsg::Commit { view, .. }
            | ControlMsg::Installed { view }
            | ControlMsg::Heartbeat { view }
            | ControlMsg::Join { view, .. }
            | ControlMsg::State { view, .. }
            | ControlMsg::NoState { view, .. }
            | ControlMsg::Declare { view, .. }
            | ControlMsg::StateRequest { view, .. } => *view,
        }
    }
}

// ---------------------------------------------------------------------------
// Wire format: little-endian; a tag byte; lists as u32 count + items.
// ---------------------------------------------------------------------------

/// A control frame that does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame ended inside a field.
    #[error("control frame truncated")]
    Truncated,
    /// Unknown message tag.
    #[error("unknown control message tag {0}")]
    UnknownTag(u8),
    /// A list longer than its bound.
    #[error("{what}: {len} entries exceed the bound of {max}")]
    TooLong {
        /// Which list.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// Bytes after the message.
    #[error("{0} bytes after the control message")]
    Trailing(usize),
    /// A field out of its domain.
    #[error("invalid control message: {0}")]
    Invalid(&'static str),
}

const TAG_SUSPECT: u8 = 1;
const TAG_PREPARE: u8 = 2;
const TAG_PROMISE: u8 = 3;
const TAG_NACK: u8 = 4;
const TAG_ACCEPT: u8 = 5;
const TAG_ACCEPTED: u8 = 6;
const TAG_COMMIT: u8 = 7;
const TAG_INSTALLED: u8 = 8;
const TAG_HEARTBEAT: u8 = 9;
const TAG_JOIN: u8 = 10;
const TAG_STATE: u8 = 11;
const TAG_STATE_REQUEST: u8 = 12;
const TAG_NO_STATE: u8 = 13;
const TAG_DECLARE: u8 = 14;

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn members(&mut self, m: &[MemberId]) {
        self.u32(m.len() as u32);
        m.iter().for_each(|x| self.u32(*x));
    }
    fn ballot(&mut self, b: &Ballot) {
        self.u64(b.round);
        self.u32(b.leader);
    }
    fn counts(&mut self, c: &[Vec<u64>]) {
        self.u32(c.len() as u32);
        for s in c {
            self.u32(s.len() as u32);
            s.iter().for_each(|x| self.u64(*x));
        }
    }
    fn decision(&mut self, d: &Decision) {
        self.u64(d.next.id);
        self.members(&d.next.members);
        self.counts(&d.trims);
        d.incarnations.iter().for_each(|i| self.u64(*i));
        self.catalogue(&d.subgroups);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn shape(
        &mut self,
        name: &str,
        descriptor: &[u8],
        window: usize,
        max_payload: usize,
        mode: DeliveryMode,
    ) {
        self.bytes(name.as_bytes());
        self.bytes(descriptor);
        self.u32(window as u32);
        self.u32(max_payload as u32);
        self.u8(match mode {
            DeliveryMode::Ordered => 0,
            DeliveryMode::Unordered => 1,
        });
    }
    fn catalogue(&mut self, subgroups: &[SubgroupConfig]) {
        self.u32(subgroups.len() as u32);
        for s in subgroups {
            self.shape(&s.name, &s.descriptor, s.window, s.max_payload, s.mode);
            self.members(&s.members);
            self.members(&s.senders);
        }
    }
    fn declaration(&mut self, d: &Declaration) {
        self.shape(&d.name, &d.descriptor, d.window, d.max_payload, d.mode);
        self.u8(d.sender as u8);
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    /// A list count, checked against its bound and against the bytes left
    /// (`item` bytes each), before anything is allocated.
    fn count(&mut self, what: &'static str, max: usize, item: usize) -> Result<usize, DecodeError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(DecodeError::TooLong { what, len, max });
        }
        if len.saturating_mul(item) > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(len)
    }
    fn members(&mut self, what: &'static str) -> Result<Vec<MemberId>, DecodeError> {
        let n = self.count(what, MAX_MEMBERS, 4)?;
        let m = (0..n).map(|_| self.u32()).collect::<Result<Vec<_>, _>>()?;
        let mut sorted = m.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != m.len() {
            return Err(DecodeError::Invalid("a member listed twice"));
        }
        Ok(m)
    }
    fn ballot(&mut self) -> Result<Ballot, DecodeError> {
        Ok(Ballot { round: self.u64()?, leader: self.u32()? })
    }
    fn counts(&mut self) -> Result<Vec<Vec<u64>>, DecodeError> {
        let n = self.count("subgroups", MAX_SUBGROUPS, 4)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.count("senders", MAX_SENDERS, 8)?;
            out.push((0..k).map(|_| self.u64()).collect::<Result<Vec<_>, _>>()?);
        }
        Ok(out)
    }
    fn decision(&mut self) -> Result<Decision, DecodeError> {
        let id = self.u64()?;
        let members = self.members("view members")?;
        if members.is_empty() {
            return Err(DecodeError::Invalid("a view without members"));
        }
        let trims = self.counts()?;
        let incarnations = (0..members.len()).map(|_| self.u64()).collect::<Result<Vec<_>, _>>()?;
        let subgroups = self.catalogue()?;
        Ok(Decision { next: View { id, members }, trims, incarnations, subgroups })
    }
    fn bytes(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, DecodeError> {
        let len = self.count(what, max, 1)?;
        let out = self.0[..len].to_vec();
        self.0 = &self.0[len..];
        Ok(out)
    }
    /// A subgroup's name and shape, as a subgroup without members yet.
    fn shape(&mut self) -> Result<SubgroupConfig, DecodeError> {
        let name = String::from_utf8(self.bytes("name", MAX_NAME)?)
            .map_err(|_| DecodeError::Invalid("a subgroup name that is not UTF-8"))?;
        let descriptor = self.bytes("descriptor", MAX_DESCRIPTOR)?;
        let (window, max_payload) = (self.u32()? as usize, self.u32()? as usize);
        if window == 0 || window > MAX_WINDOW || max_payload == 0 || max_payload > MAX_PAYLOAD {
            return Err(DecodeError::Invalid("a subgroup's window or max_payload out of range"));
        }
        let mode = match self.u8()? {
            0 => DeliveryMode::Ordered,
            1 => DeliveryMode::Unordered,
            _ => return Err(DecodeError::Invalid("delivery mode")),
        };
        Ok(SubgroupConfig {
            members: Vec::new(),
            senders: Vec::new(),
            window,
            max_payload,
            mode,
            name,
            descriptor,
        })
    }
    fn catalogue(&mut self) -> Result<Vec<SubgroupConfig>, DecodeError> {
        let start = self.0.len();
        let n = self.count("catalogue", MAX_SUBGROUPS, 24)?;
        let mut out: Vec<SubgroupConfig> = Vec::with_capacity(n);
        for _ in 0..n {
            let mut s = self.shape()?;
            s.members = self.members("subgroup members")?;
            s.senders = self.members("subgroup senders")?;
            if s.members.is_empty() || s.senders.iter().any(|m| !s.members.contains(m)) {
                return Err(DecodeError::Invalid("a subgroup's senders are not among its members"));
            }
            if !s.name.is_empty() && out.iter().any(|o| o.name == s.name) {
                return Err(DecodeError::Invalid("a subgroup name listed twice"));
            }
            out.push(s);
        }
        if start - self.0.len() > MAX_CATALOGUE_BYTES {
            return Err(DecodeError::TooLong {
                what: "catalogue bytes",
                len: start - self.0.len(),
                max: MAX_CATALOGUE_BYTES,
            });
        }
        Ok(out)
    }
    fn declaration(&mut self) -> Result<Declaration, DecodeError> {
        let s = self.shape()?;
        let sender = match self.u8()? {
            0 => false,
            1 => true,
            _ => return Err(DecodeError::Invalid("sender flag")),
        };
        let SubgroupConfig { name, descriptor, window, max_payload, mode, .. } = s;
        let d = Declaration { name, descriptor, window, max_payload, mode, sender };
        d.check().map_err(|_| DecodeError::Invalid("a malformed declaration"))?;
        Ok(d)
    }
}

impl ControlMsg {
    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        match self {
            ControlMsg::Suspect { view, suspects } => {
                w.u8(TAG_SUSPECT);
                w.u64(*view);
                w.members(suspects);
            }
            ControlMsg::Prepare { view, ballot } => {
                w.u8(TAG_PREPARE);
                w.u64(*view);
                w.ballot(ballot);
            }
            ControlMsg::Promise { view, ballot, accepted, received, suspects } => {
                w.u8(TAG_PROMISE);
                w.u64(*view);
                w.ballot(ballot);
                match accepted {
                    None => w.u8(0),
                    Some((b, d)) => {
                        w.u8(1);
                        w.ballot(b);
                        w.decision(d);
                    }
                }
                w.counts(received);
                w.members(suspects);
            }
            ControlMsg::Nack { view, promised } => {
                w.u8(TAG_NACK);
                w.u64(*view);
                w.ballot(promised);
            }
            ControlMsg::Accept { view, ballot, decision } => {
                w.u8(TAG_ACCEPT);
                w.u64(*view);
                w.ballot(ballot);
                w.decision(decision);
            }
            ControlMsg::Accepted { view, ballot } => {
                w.u8(TAG_ACCEPTED);
                w.u64(*view);
                w.ballot(ballot);
            }
            ControlMsg::Commit { view, decision } => {
                w.u8(TAG_COMMIT);
                w.u64(*view);
                w.decision(decision);
            }
            ControlMsg::Installed { view } => {
                w.u8(TAG_INSTALLED);
                w.u64(*view);
            }
            ControlMsg::Heartbeat { view } => {
                w.u8(TAG_HEARTBEAT);
                w.u64(*view);
            }
            ControlMsg::Join { view, incarnation } => {
                w.u8(TAG_JOIN);
                w.u64(*view);
                w.u64(*incarnation);
            }
            ControlMsg::State { view, subgroup, offset, total, bytes } => {
                w.u8(TAG_STATE);
                w.u64(*view);
                w.u32(*subgroup);
                w.u64(*offset);
                w.u64(*total);
                w.u32(bytes.len() as u32);
                w.0.extend_from_slice(bytes);
            }
            ControlMsg::NoState { view, subgroup } => {
                w.u8(TAG_NO_STATE);
                w.u64(*view);
                w.u32(*subgroup);
            }
            ControlMsg::Declare { view, declaration } => {
                w.u8(TAG_DECLARE);
                w.u64(*view);
                w.declaration(declaration);
            }
            ControlMsg::StateRequest { view, subgroup, offset } => {
                w.u8(TAG_STATE_REQUEST);
                w.u64(*view);
                w.u32(*subgroup);
                w.u64(*offset);
            }
        }
    }

    /// The encoding as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Decodes one whole message; bounded, never panics.
    pub fn decode(bytes: &[u8]) -> Result<ControlMsg, DecodeError> {
        let mut r = Reader(bytes);
        let tag = r.u8()?;
        let view = r.u64()?;
        let msg = match tag {
            TAG_SUSPECT => ControlMsg::Suspect { view, suspects: r.members("suspects")? },
            TAG_PREPARE => ControlMsg::Prepare { view, ballot: r.ballot()? },
            TAG_PROMISE => {
                let ballot = r.ballot()?;
                let accepted = match r.u8()? {
                    0 => None,
                    1 => Some((r.ballot()?, r.decision()?)),
                    _ => return Err(DecodeError::Invalid("accepted flag")),
                };
                ControlMsg::Promise {
                    view,
                    ballot,
                    accepted,
                    received: r.counts()?,
                    suspects: r.members("suspects")?,
                }
            }
            TAG_NACK => ControlMsg::Nack { view, promised: r.ballot()? },
            TAG_ACCEPT => ControlMsg::Accept { view, ballot: r.ballot()?, decision: r.decision()? },
            TAG_ACCEPTED => ControlMsg::Accepted { view, ballot: r.ballot()? },
            TAG_COMMIT => ControlMsg::Commit { view, decision: r.decision()? },
            TAG_INSTALLED => ControlMsg::Installed { view },
            TAG_HEARTBEAT => ControlMsg::Heartbeat { view },
            TAG_JOIN => {
                let incarnation = r.u64()?;
                if incarnation == 0 {
                    return Err(DecodeError::Invalid("a joiner's incarnation is never 0"));
                }
                ControlMsg::Join { view, incarnation }
            }
            TAG_STATE => {
                let (subgroup, offset, total) = (r.u32()?, r.u64()?, r.u64()?);
                let len = r.count("state chunk", STATE_CHUNK, 1)?;
                if total > MAX_STATE || offset.saturating_add(len as u64) > total {
                    return Err(DecodeError::Invalid("a state chunk beyond its total"));
                }
                let bytes = r.0[..len].to_vec();
                r.0 = &r.0[len..];
                ControlMsg::State { view, subgroup, offset, total, bytes }
            }
            TAG_STATE_REQUEST => ControlMsg::StateRequest { view, subgroup: r.u32()?, offset: r.u64()? },
            TAG_NO_STATE => ControlMsg::NoState { view, subgroup: r.u32()? },
            TAG_DECLARE => ControlMsg::Declare { view, declaration: r.declaration()? },
            t => return Err(DecodeError::UnknownTag(t)),
        };
        if !r.0.is_empty() {
            return Err(DecodeError::Trailing(r.0.len()));
        }
        Ok(msg)
    }
}

// ---------------------------------------------------------------------------
// The allocation rule
// ---------------------------------------------------------------------------

/// The group a view runs: the configured group restricted to the view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewGroup {
    /// The view.
    pub view: View,
    /// The engine's configuration for the view: top-level members are the
    /// view's (rank order); each configured subgroup keeps its members and
    /// senders that are in the view (in their configured order) and is
    /// **active** if at least one of each remains; inactive subgroups are
    /// left out.
    pub config: GroupConfig,
    /// Per configured subgroup, its index in `config` (None: inactive).
    pub index: Vec<Option<usize>>,
    /// Per subgroup of `config`, its configured index.
    pub configured: Vec<usize>,
}

/// The allocation rule: which subgroups the members of `view` form, from
/// the configured `template` (every member that may ever belong, subgroups
/// with configured member and sender lists). Documented in [`ViewGroup`].
pub fn allocate(template: &GroupConfig, view: &View) -> ViewGroup {
    let mut subgroups = Vec::new();
    let mut index = Vec::with_capacity(template.subgroups.len());
    let mut configured = Vec::new();
    for (g, s) in template.subgroups.iter().enumerate() {
        let members: Vec<MemberId> = s.members.iter().copied().filter(|m| view.contains(*m)).collect();
        let senders: Vec<MemberId> = s.senders.iter().copied().filter(|m| view.contains(*m)).collect();
        if members.is_empty() || senders.is_empty() {
            index.push(None);
            continue;
        }
        index.push(Some(subgroups.len()));
        configured.push(g);
        subgroups.push(SubgroupConfig { members, senders, ..s.clone() });
    }
    let config = GroupConfig { members: view.members.clone(), subgroups, switches: template.switches };
    debug_assert!(config.validate_view().is_ok(), "an allocation of a valid template is valid");
    ViewGroup { view: view.clone(), config, index, configured }
}

// ---------------------------------------------------------------------------
// The state machine
// ---------------------------------------------------------------------------

/// What the view change asks of the member that runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewEvent {
    /// Wedge the engine now (before its next poll).
    Wedge,
    /// Deliver the ragged edge of `old` with `decision.trims`, collect the
    /// own messages to resend, and install `decision.next`.
    Install {
        /// The failed view.
        old: ViewGroup,
        /// What was decided.
        decision: Decision,
    },
    /// This joiner is in the next view: install `decision.next` (a new
    /// endpoint) and receive the state of its subgroups before delivering.
    Joined {
        /// What was decided.
        decision: Decision,
    },
    /// This member is not in the next view: it stops (a removed member
    /// rejoins only as a new incarnation).
    Removed {
        /// The view it was in.
        view: View,
        /// The next view, without it.
        next: View,
    },
    /// The members this one does not suspect are no majority of the view:
    /// it stops and never installs a view (partition safety).
    Minority {
        /// The view.
        view: View,
        /// Its suspects.
        suspects: Vec<MemberId>,
    },
    /// One of this member's declarations is settled.
    Answered(DeclarationAnswer),
}

/// How one of this member's declarations was settled (reported by
/// [`ViewEvent::Answered`], and by `ViewMember` once the view that took
/// it is open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclarationAnswer {
    /// The subgroup's name.
    pub name: String,
    /// `Ok(index)`: the catalogue has this member in subgroup `index`
    /// (configured index) from the current view on; `Err(why)`: refused
    /// for good.
    pub outcome: Result<usize, String>,
}

/// Where a member's view change stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// In a view (changing it or not).
    Running,
    /// Left out of a view: stopped.
    Removed,
    /// In a minority: stopped.
    Minority,
    /// Not in the group yet: asking to join.
    Joining,
}

/// Ticks without an answer after which a member suspects whoever it waits
/// for (see [`ViewChange::set_patience`]).
pub const DEFAULT_PATIENCE: u32 = 4;
/// A member sends a heartbeat every this many ticks.
pub const HEARTBEAT_TICKS: u64 = 2;
/// A member silent for this many patiences is suspected (missed
/// heartbeats: with the default patience, 8 ticks, 4 heartbeats; a member
/// not heard from at all in the view, four times that).
pub const SILENCE_PATIENCES: u32 = 2;

#[derive(Clone, Debug)]
struct PromiseInfo {
    accepted: Option<(Ballot, Decision)>,
    received: Vec<Vec<u64>>,
}

#[derive(Clone, Debug)]
enum Phase {
    Promises(BTreeMap<MemberId, PromiseInfo>),
    Accepts { decision: Decision, accepted: BTreeSet<MemberId> },
}

#[derive(Clone, Debug)]
struct Lead {
    ballot: Ballot,
    phase: Phase,
    /// Ticks since the phase began.
    ticks: u32,
}

/// One member's view-change state machine. Inputs: [`suspect`](Self::suspect),
/// [`leave`](Self::leave), [`on_message`](Self::on_message),
/// [`tick`](Self::tick) (retransmissions and response timeouts). Outputs:
/// [`take_outbox`](Self::take_outbox) (messages to send) and
/// [`take_events`](Self::take_events) (what the member must do), drained
/// after every input.
///
/// # Suspicions
/// A member's **own** suspicions (its fabric's timeouts, heartbeats, and a
/// peer that does not answer it for [`patience`](Self::set_patience)
/// ticks while it waits on it) are final for the view. Suspicions
/// **reported** by others (gossip, promises) wedge it and steer the choice
/// of the leader (the lowest-ranked member nobody it trusts suspects), but
/// never count towards its minority check and never make a leader wait for
/// fewer members: a member about to find itself in a minority reports
/// suspicions of the majority before it stops, and adopting them would
/// stop the majority too. Reports from a member it suspects are ignored.
#[derive(Debug)]
pub struct ViewChange {
    me: MemberId,
    /// This member's incarnation (0: an original member).
    incarnation: u64,
    /// Incarnations of the current view's members.
    incarnation_of: BTreeMap<MemberId, u64>,
    /// Joiners heard from in this view, with their incarnations.
    joiners: BTreeMap<MemberId, u64>,
    /// Pending declarations heard in this view, by declarer, in arrival
    /// order (at most [`MAX_DECLARATIONS`] each).
    declared: BTreeMap<MemberId, Vec<Declaration>>,
    /// This member's own declarations not in the catalogue yet.
    own: Vec<Declaration>,
    /// The catalogue: configured members, and every subgroup that exists
    /// (configured or declared) — what every view is allocated from.
    template: GroupConfig,
    group: ViewGroup,
    suspects: BTreeSet<MemberId>,
    reports: BTreeMap<MemberId, BTreeSet<MemberId>>,
    wedged: bool,
    leaving: bool,
    promised: Option<Ballot>,
    accepted: Option<(Ballot, Decision)>,
    max_round: u64,
    lead: Option<Lead>,
    /// Ticks since this (wedged, not leading) member last heard from a
    /// leader of the view.
    waiting_ticks: u32,
    /// Ticks since a lower-ranked member this one trusts last asked it
    /// to promise or accept (it leads: do not compete with it).
    yield_ticks: u32,
    /// That member.
    yield_to: Option<MemberId>,
    patience: u32,
    /// Ticks since each member of the view was last heard from.
    silent: BTreeMap<MemberId, u32>,
    /// Members heard from in this view.
    heard: BTreeSet<MemberId>,
    /// Ticks since this member's trusted members stopped being a majority
    /// (it waits a patience for a decision it may have missed before it
    /// stops).
    minority_ticks: Option<u32>,
    ticks: u64,
    /// Decided views, to answer stragglers (the last [`KEPT_DECISIONS`]).
    decisions: BTreeMap<u64, Decision>,
    /// Commits of earlier views not yet acknowledged, by member.
    unacked: BTreeMap<u64, BTreeSet<MemberId>>,
    status: Status,
    outbox: Vec<(MemberId, ControlMsg)>,
    events: Vec<ViewEvent>,
}

impl ViewChange {
    /// Member `me` in `view` of the configured group `template`.
    pub fn new(me: MemberId, template: GroupConfig, view: View) -> Result<ViewChange, ConfigError> {
        template.validate_template()?;
        if !view.contains(me) {
            return Err(ConfigError::Group(format!("member {me} is not in {view}")));
        }
        if let Some(x) = view.members.iter().find(|m| !template.members.contains(m)) {
            return Err(ConfigError::Group(format!("{view}: member {x} is not configured")));
        }
        let group = allocate(&template, &view);
        group.config.validate_view()?;
        Ok(ViewChange {
            me,
            incarnation: 0,
            incarnation_of: view.members.iter().map(|m| (*m, 0)).collect(),
            joiners: BTreeMap::new(),
            declared: BTreeMap::new(),
            own: Vec::new(),
            template,
            group,
            suspects: BTreeSet::new(),
            reports: BTreeMap::new(),
            wedged: false,
            leaving: false,
            promised: None,
            accepted: None,
            max_round: 0,
            lead: None,
            waiting_ticks: 0,
            yield_ticks: u32::MAX,
            yield_to: None,
            patience: DEFAULT_PATIENCE,
            silent: BTreeMap::new(),
            heard: BTreeSet::new(),
            minority_ticks: None,
            ticks: 0,
            decisions: BTreeMap::new(),
            unacked: BTreeMap::new(),
            status: Status::Running,
            outbox: Vec::new(),
            events: Vec::new(),
        })
    }

    /// Member `me` of the configured group `template`, not in the group:
    /// it asks to join (every tick, to every configured member) as
    /// `incarnation` (unique per start, not 0) until a commit includes it
    /// ([`ViewEvent::Joined`]).
    pub fn joining(me: MemberId, template: GroupConfig, incarnation: u64) -> Result<ViewChange, ConfigError> {
        assert_ne!(incarnation, 0, "a joiner's incarnation is never 0");
        if !template.members.contains(&me) {
            return Err(ConfigError::Group(format!("member {me} is not configured")));
        }
        let mut vc = ViewChange::new(me, template, View { id: 0, members: vec![me] })?;
        vc.incarnation = incarnation;
        vc.incarnation_of.insert(me, incarnation);
        vc.status = Status::Joining;
        Ok(vc)
    }

    /// This member's incarnation (0: an original member).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Ticks without an answer after which a member suspects whoever it
    /// waits for (at least 1; default [`DEFAULT_PATIENCE`]). With ticks every
    /// `t`, a silent member is suspected after about `patience × t`.
    pub fn set_patience(&mut self, ticks: u32) {
        self.patience = ticks.max(1);
    }

    /// The current view.
    pub fn view(&self) -> &View {
        &self.group.view
    }

    /// The current view's group (engine configuration and index maps).
    pub fn group(&self) -> &ViewGroup {
        &self.group
    }

    /// The catalogue the current view was allocated from: every subgroup
    /// that exists, in configured order.
    pub fn template(&self) -> &GroupConfig {
        &self.template
    }

    /// Asks to be in the subgroup `d.name` (see the module docs). Answered
    /// by [`ViewEvent::Answered`] — at once if the catalogue already has
    /// this member there, or refused; until
    /// then it is re-sent every tick (a view change per declaration).
    /// `received` as for [`suspect`](Self::suspect).
    pub fn declare(&mut self, d: Declaration, received: &[Vec<u64>]) {
        match declaration_status(&self.template, self.me, &d) {
            Declared::Pending => {
                // One pending declaration per name: a second one of the
                // same shape joins it (a sender if either asked to be).
                let d = match self.own.iter().position(|o| o.name == d.name) {
                    Some(i) if self.own[i] == Declaration { sender: self.own[i].sender, ..d.clone() } => {
                        let mut merged = self.own.remove(i);
                        merged.sender |= d.sender;
                        merged
                    }
                    Some(_) => {
                        let why = "a declaration of this name with another shape is pending".into();
                        self.events
                            .push(ViewEvent::Answered(DeclarationAnswer { name: d.name, outcome: Err(why) }));
                        return;
                    }
                    None => d,
                };
                self.own.push(d.clone());
                if self.status == Status::Running {
                    self.broadcast(ControlMsg::Declare { view: self.group.view.id, declaration: d.clone() });
                    self.note_declaration(self.me, d, received);
                }
            }
            settled => self.answer(d, settled),
        }
    }

    /// Reports a settled declaration of this member's.
    fn answer(&mut self, d: Declaration, status: Declared) {
        let outcome = match status {
            Declared::In(g) => Ok(g),
            Declared::Refused(why) => Err(why),
            Declared::Pending => return self.own.push(d),
        };
        self.events.push(ViewEvent::Answered(DeclarationAnswer { name: d.name, outcome }));
    }

    /// A pending declaration heard (or made) in this view: remembered for
    /// the next fresh decision; the change starts.
    fn note_declaration(&mut self, from: MemberId, d: Declaration, received: &[Vec<u64>]) {
        if declaration_status(&self.template, from, &d) != Declared::Pending {
            return;
        }
        let list = self.declared.entry(from).or_default();
        if list.contains(&d) {
            return;
        }
        if list.len() >= MAX_DECLARATIONS {
            return;
        }
        list.push(d);
        self.wedge();
        self.drive(received);
    }

    /// Reports this member's declarations the installed catalogue settled.
    fn settle_own(&mut self) {
        let own = std::mem::take(&mut self.own);
        for d in own {
            let status = declaration_status(&self.template, self.me, &d);
            self.answer(d, status);
        }
    }

    /// This member.
    pub fn member(&self) -> MemberId {
        self.me
    }

    /// Running, removed or in a minority.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Whether a view change is under way (this member is wedged).
    pub fn is_changing(&self) -> bool {
        self.wedged
    }

    /// Members this one suspects in the current view.
    pub fn suspects(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.suspects.iter().copied()
    }

    /// Own suspicions and those reported by members not suspected.
    fn excluded(&self) -> BTreeSet<MemberId> {
        let mut out = self.suspects.clone();
        for (from, set) in &self.reports {
            if !self.suspects.contains(from) {
                out.extend(set.iter().copied());
            }
        }
        out
    }

    /// The view leader as this member sees it: the lowest-ranked member
    /// neither it nor anyone it trusts suspects (or, if that excludes
    /// everyone, the lowest-ranked it does not suspect itself).
    pub fn leader(&self) -> Option<MemberId> {
        let excluded = self.excluded();
        let members = &self.group.view.members;
        members
            .iter()
            .copied()
            .find(|m| !excluded.contains(m))
            .or_else(|| members.iter().copied().find(|m| !self.suspects.contains(m)))
    }

    /// Messages to send, as (destination, message).
    pub fn take_outbox(&mut self) -> Vec<(MemberId, ControlMsg)> {
        std::mem::take(&mut self.outbox)
    }

    /// What the member must do, in order.
    pub fn take_events(&mut self) -> Vec<ViewEvent> {
        std::mem::take(&mut self.events)
    }

    /// Local suspicion of `peer` (fabric timeout, missed heartbeats).
    /// `received` is this member's engine's
    /// [`received_rounds`](crate::Engine::received_rounds), read with the
    /// engine still: the caller wedges the engine on [`ViewEvent::Wedge`]
    /// before it polls again, so these counts are the frozen ones.
    pub fn suspect(&mut self, peer: MemberId, received: &[Vec<u64>]) {
        if self.status != Status::Running || !self.group.view.contains(peer) || peer == self.me {
            return;
        }
        if self.add_suspects([peer]) {
            self.gossip_suspects();
        }
        self.drive(received);
    }

    /// This member leaves the group gracefully: it tells the others to
    /// suspect it; the view change that follows removes it.
    pub fn leave(&mut self, received: &[Vec<u64>]) {
        if self.status != Status::Running {
            return;
        }
        self.leaving = true;
        self.lead = None;
        self.wedge();
        self.broadcast(ControlMsg::Suspect { view: self.group.view.id, suspects: vec![self.me] });
        self.drive(received);
    }

    /// Retransmits what may have been lost — suspicions while changing, the
    /// leader's current phase to members that have not answered, commits
    /// not yet acknowledged — and suspects whoever this member waited on
    /// for its patience. Call periodically.
    pub fn tick(&mut self, received: &[Vec<u64>]) {
        if self.status == Status::Joining {
            let msg = ControlMsg::Join { view: 0, incarnation: self.incarnation };
            for &m in &self.template.members {
                if m != self.me {
                    self.outbox.push((m, msg.clone()));
                }
            }
            return;
        }
        if self.status != Status::Running {
            return;
        }
        let view = self.group.view.id;
        for d in self.own.clone() {
            self.broadcast(ControlMsg::Declare { view, declaration: d.clone() });
            self.note_declaration(self.me, d, received);
        }
        for (&v, waiting) in &self.unacked {
            let decision = self.decisions[&v].clone();
            for &m in waiting {
                self.outbox.push((m, ControlMsg::Commit { view: v, decision: decision.clone() }));
            }
        }
        self.ticks += 1;
        if self.ticks.is_multiple_of(HEARTBEAT_TICKS) {
            self.broadcast(ControlMsg::Heartbeat { view });
        }
        let limit = self.patience.saturating_mul(SILENCE_PATIENCES);
        let mut quiet = Vec::new();
        for &m in &self.group.view.members {
            if m != self.me && !self.suspects.contains(&m) {
                // A member not heard from yet in this view may still be
                // opening it (its links come up one by one): it gets four
                // times the time.
                let grace = if self.heard.contains(&m) { limit } else { limit.saturating_mul(4) };
                let t = self.silent.entry(m).or_insert(0);
                *t += 1;
                if *t > grace {
                    quiet.push(m);
                }
            }
        }
        if self.add_suspects(quiet) {
            self.gossip_suspects();
        }
        if !self.wedged {
            return;
        }
        if let Some(t) = self.minority_ticks.as_mut() {
            *t += 1;
        }
        self.yield_ticks = self.yield_ticks.saturating_add(1);
        if self.leaving {
            self.broadcast(ControlMsg::Suspect { view, suspects: vec![self.me] });
        } else if !self.suspects.is_empty() {
            self.gossip_suspects();
        }
        let patience = self.patience;
        let mut silent = Vec::new();
        if let Some(lead) = &mut self.lead {
            lead.ticks += 1;
            let ballot = lead.ballot;
            let expired = lead.ticks >= patience;
            match &lead.phase {
                Phase::Promises(got) => {
                    for m in self.group.view.members.iter().copied() {
                        if m != self.me && !got.contains_key(&m) {
                            self.outbox.push((m, ControlMsg::Prepare { view, ballot }));
                            if expired && !self.suspects.contains(&m) {
                                silent.push(m);
                            }
                        }
                    }
                }
                Phase::Accepts { decision, accepted } => {
                    for m in self.group.view.members.iter().copied() {
                        if m != self.me && !accepted.contains(&m) {
                            let msg = ControlMsg::Accept { view, ballot, decision: decision.clone() };
                            self.outbox.push((m, msg));
                            if expired && decision.next.contains(m) && !self.suspects.contains(&m) {
                                silent.push(m);
                            }
                        }
                    }
                }
            }
        } else {
            self.waiting_ticks += 1;
            // Longer than a leader yields to a lower-ranked one's last ballot
            // (twice the patience), so a yielding leader is not suspected.
            if self.waiting_ticks >= patience.saturating_mul(3)
                && let Some(l) = self.leader()
                && l != self.me
            {
                // The leader this member waits for has not prepared or
                // answered: suspect it, so the next one takes over.
                silent.push(l);
                self.waiting_ticks = 0;
            }
        }
        if self.add_suspects(silent) {
            self.gossip_suspects();
        }
        self.drive(received);
    }

    /// A message from `from`. `received` as for [`suspect`](Self::suspect).
    pub fn on_message(&mut self, from: MemberId, msg: ControlMsg, received: &[Vec<u64>]) {
        if from == self.me {
            return;
        }
        if self.status == Status::Joining {
            if let ControlMsg::Commit { decision, .. } = msg
                && decision.incarnation_of(self.me) == Some(self.incarnation)
                && self.joined_ok(&decision)
            {
                self.join_learn(decision);
            }
            return;
        }
        if self.status != Status::Running {
            return;
        }
        match msg {
            ControlMsg::Join { incarnation, .. } => return self.on_join(from, incarnation, received),
            // State transfer is the member's business, not the view change's.
            ControlMsg::State { .. } | ControlMsg::StateRequest { .. } | ControlMsg::NoState { .. } => return,
            _ => {}
        }
        let view = self.group.view.id;
        let v = msg.view();
        if v < view {
            // A straggler of an earlier view: tell it what was decided.
            match msg {
                ControlMsg::Installed { view: old } => {
                    if let Some(w) = self.unacked.get_mut(&old) {
                        w.remove(&from);
                        if w.is_empty() {
                            self.unacked.remove(&old);
                        }
                    }
                }
                ControlMsg::Commit { .. } => self.outbox.push((from, ControlMsg::Installed { view: v })),
                _ => {
                    if let Some(d) = self.decisions.get(&v) {
                        self.outbox.push((from, ControlMsg::Commit { view: v, decision: d.clone() }));
                    }
                }
            }
            return;
        }
        if v > view || !self.group.view.contains(from) {
            // A later view this member has not installed yet (its commit is
            // retransmitted to it), or a non-member: nothing to apply.
            return;
        }
        self.silent.insert(from, 0);
        self.heard.insert(from);
        match msg {
            ControlMsg::Declare { declaration, .. } => self.note_declaration(from, declaration, received),
            ControlMsg::Suspect { suspects, .. } => {
                if suspects.contains(&from) {
                    // A graceful leave: a member is trusted about itself.
                    if self.add_suspects([from]) {
                        self.gossip_suspects();
                    }
                } else if !self.suspects.contains(&from) {
                    self.report(from, suspects);
                }
            }
            ControlMsg::Prepare { ballot, .. } => {
                self.max_round = self.max_round.max(ballot.round);
                self.note_leader(from);
                if self.promised.is_some_and(|p| p > ballot) {
                    let promised = self.promised.expect("checked");
                    self.outbox.push((from, ControlMsg::Nack { view, promised }));
                } else {
                    self.wedge();
                    self.waiting_ticks = 0;
                    self.promised = Some(ballot);
                    if self.lead.as_ref().is_some_and(|l| l.ballot < ballot) {
                        self.lead = None;
                    }
                    let promise = ControlMsg::Promise {
                        view,
                        ballot,
                        accepted: self.accepted.clone(),
                        received: received.to_vec(),
                        suspects: self.suspects.iter().copied().collect(),
                    };
                    self.outbox.push((from, promise));
                }
            }
            ControlMsg::Promise { ballot, accepted, received: theirs, suspects, .. } => {
                let shape_ok = self.shape_ok(from, &theirs);
                if let Some(Lead { ballot: b, phase: Phase::Promises(got), .. }) = &mut self.lead
                    && *b == ballot
                    && shape_ok
                {
                    got.insert(from, PromiseInfo { accepted, received: theirs });
                }
                if !self.suspects.contains(&from) && !suspects.is_empty() {
                    self.report(from, suspects);
                }
            }
            ControlMsg::Nack { promised, .. } => {
                self.max_round = self.max_round.max(promised.round);
                if self.lead.as_ref().is_some_and(|l| l.ballot < promised) {
                    // Outbid: step back; try again (higher) if still the
                    // leader after waiting for the other one.
                    self.lead = None;
                    self.waiting_ticks = 0;
                }
            }
            ControlMsg::Accept { ballot, decision, .. } => {
                self.max_round = self.max_round.max(ballot.round);
                self.note_leader(from);
                if self.promised.is_some_and(|p| p > ballot) {
                    let promised = self.promised.expect("checked");
                    self.outbox.push((from, ControlMsg::Nack { view, promised }));
                } else if self.decision_ok(&decision) {
                    self.wedge();
                    self.waiting_ticks = 0;
                    self.promised = Some(ballot);
                    if self.lead.as_ref().is_some_and(|l| l.ballot < ballot) {
                        self.lead = None;
                    }
                    self.accepted = Some((ballot, decision));
                    self.outbox.push((from, ControlMsg::Accepted { view, ballot }));
                }
            }
            ControlMsg::Accepted { ballot, .. } => {
                if let Some(Lead { ballot: b, phase: Phase::Accepts { accepted, .. }, .. }) = &mut self.lead
                    && *b == ballot
                {
                    accepted.insert(from);
                }
            }
            ControlMsg::Commit { decision, .. } => {
                if self.decision_ok(&decision) {
                    self.learn(decision);
                    return;
                }
            }
            ControlMsg::Installed { .. } | ControlMsg::Heartbeat { .. } => {}
            ControlMsg::Join { .. }
            | ControlMsg::State { .. }
            | ControlMsg::StateRequest { .. }
            | ControlMsg::NoState { .. } => {
                unreachable!("handled above")
            }
        }
        self.drive(received);
    }

    /// `from` runs a ballot: if it ranks below this member, this member
    /// stops competing while `from` keeps at it (several members that each
    /// think they lead — their suspicions differ, two may even suspect each
    /// other — would otherwise preempt each other's ballots for ever). A
    /// leader only runs ballots with a majority it trusts, and one that
    /// stops (it died) is not waited for longer than twice the patience.
    fn note_leader(&mut self, from: MemberId) {
        let rank = |m: MemberId| self.group.view.members.iter().position(|x| *x == m);
        if rank(from) < rank(self.me) {
            self.yield_ticks = 0;
            self.yield_to = Some(from);
            self.lead = None;
        }
    }

    /// A configured member asks to join as `incarnation`: it is added by
    /// the next view change (which this starts). If an earlier incarnation
    /// of it is still in the view, that one is gone: suspect it first (the
    /// change after it adds the new one).
    fn on_join(&mut self, from: MemberId, incarnation: u64, received: &[Vec<u64>]) {
        if !self.template.members.contains(&from) {
            return;
        }
        if self.group.view.contains(from) {
            if self.incarnation_of.get(&from) == Some(&incarnation) {
                // It joined but has not learned it: the decision again.
                let v = self.group.view.id;
                if let Some(d) = v.checked_sub(1).and_then(|p| self.decisions.get(&p))
                    && d.incarnation_of(from) == Some(incarnation)
                {
                    self.outbox.push((from, ControlMsg::Commit { view: v - 1, decision: d.clone() }));
                }
                return;
            }
            if self.add_suspects([from]) {
                self.gossip_suspects();
            }
        }
        self.joiners.insert(from, incarnation);
        self.wedge();
        self.drive(received);
    }

    /// A decision a joiner may install: numbered, shaped, naming it.
    fn joined_ok(&self, d: &Decision) -> bool {
        d.next.id > 0
            && !d.next.members.is_empty()
            && d.incarnations.len() == d.next.members.len()
            && d.next.members.iter().all(|m| self.template.members.contains(m))
            && self.catalogue_ok(&d.subgroups)
    }

    /// A decision's catalogue: its subgroups' members are configured
    /// members, and it is a valid template.
    fn catalogue_ok(&self, subgroups: &[SubgroupConfig]) -> bool {
        let t = GroupConfig {
            members: self.template.members.clone(),
            subgroups: subgroups.to_vec(),
            switches: self.template.switches,
        };
        t.validate_template().is_ok()
    }

    /// This joiner is in `decision.next`: it becomes a member of it.
    fn join_learn(&mut self, decision: Decision) {
        self.template.subgroups = decision.subgroups.clone();
        self.group = allocate(&self.template, &decision.next);
        self.incarnation_of =
            decision.next.members.iter().copied().zip(decision.incarnations.iter().copied()).collect();
        self.status = Status::Running;
        self.suspects.clear();
        self.reports.clear();
        self.silent.clear();
        self.heard.clear();
        self.joiners.clear();
        self.declared.clear();
        self.wedged = false;
        self.events.push(ViewEvent::Joined { decision });
        self.settle_own();
    }

    /// `from` suspects `suspects`: wedge, and remember it for the choice of
    /// the leader.
    fn report(&mut self, from: MemberId, suspects: Vec<MemberId>) {
        let known: Vec<MemberId> = suspects.into_iter().filter(|m| self.group.view.contains(*m)).collect();
        if known.is_empty() {
            return;
        }
        self.reports.entry(from).or_default().extend(known);
        self.wedge();
    }

    /// A promise's counts fit the view's subgroups: one list per subgroup,
    /// one count per sender for the subgroups `from` is in, none elsewhere.
    fn shape_ok(&self, from: MemberId, counts: &[Vec<u64>]) -> bool {
        let subs = &self.group.config.subgroups;
        counts.len() == subs.len()
            && subs.iter().zip(counts).all(|(s, c)| {
                if s.members.contains(&from) { c.len() == s.senders.len() } else { c.is_empty() }
            })
    }

    /// A decision fits this view: the next view numbered after it, its
    /// members members of this one, trims shaped like its subgroups.
    fn decision_ok(&self, d: &Decision) -> bool {
        let subs = &self.group.config.subgroups;
        d.next.id == self.group.view.id + 1
            && !d.next.members.is_empty()
            && d.incarnations.len() == d.next.members.len()
            && d.next
                .members
                .iter()
                .all(|m| self.group.view.contains(*m) || self.template.members.contains(m))
            && d.trims.len() == subs.len()
            && subs.iter().zip(&d.trims).all(|(s, t)| t.is_empty() || t.len() == s.senders.len())
            && extends(&self.template.subgroups, &d.subgroups)
            && self.catalogue_ok(&d.subgroups)
    }

    fn add_suspects(&mut self, peers: impl IntoIterator<Item = MemberId>) -> bool {
        let mut new = false;
        for p in peers {
            if p != self.me && self.group.view.contains(p) && self.suspects.insert(p) {
                new = true;
                for w in self.unacked.values_mut() {
                    w.remove(&p);
                }
            }
        }
        self.unacked.retain(|_, w| !w.is_empty());
        if new {
            self.wedge();
        }
        new
    }

    fn wedge(&mut self) {
        if !self.wedged {
            self.wedged = true;
            self.waiting_ticks = 0;
            self.events.push(ViewEvent::Wedge);
        }
    }

    fn broadcast(&mut self, msg: ControlMsg) {
        for &m in &self.group.view.members {
            if m != self.me {
                self.outbox.push((m, msg.clone()));
            }
        }
    }

    fn gossip_suspects(&mut self) {
        let msg = ControlMsg::Suspect {
            view: self.group.view.id,
            suspects: self.suspects.iter().copied().collect(),
        };
        let targets: Vec<MemberId> = self
            .group
            .view
            .members
            .iter()
            .copied()
            .filter(|m| *m != self.me && !self.suspects.contains(m))
            .collect();
        for m in targets {
            self.outbox.push((m, msg.clone()));
        }
    }

    /// Members this member does not suspect itself (it needs each one's
    /// answer while it leads).
    fn trusted(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.group.view.members.iter().copied().filter(|m| !self.suspects.contains(m))
    }

    /// The leader's progress and the minority check, after every input.
    fn drive(&mut self, received: &[Vec<u64>]) {
        if self.status != Status::Running || !self.wedged {
            return;
        }
        let view = self.group.view.clone();
        if self.trusted().count() < view.majority() {
            // No majority left to lead: wait a patience (a decision may be
            // on its way — a member that installed the next view closes its
            // old links, which looks like a failure), then stop.
            self.lead = None;
            let waited = *self.minority_ticks.get_or_insert(0);
            if waited >= self.patience {
                self.status = Status::Minority;
                self.events
                    .push(ViewEvent::Minority { view, suspects: self.suspects.iter().copied().collect() });
            }
            return;
        }
        self.minority_ticks = None;
        if self.leaving || self.leader() != Some(self.me) {
            self.lead = None;
            return;
        }
        if self.lead.is_none() {
            // A lower-ranked leader this member does not suspect is at work
            // (it promised its ballot lately): let it finish.
            let rank = |m: MemberId| view.members.iter().position(|x| *x == m);
            if self.promised.is_some_and(|p| p.leader != self.me && rank(p.leader) < rank(self.me))
                && self.waiting_ticks < self.patience
                && !self.suspects.contains(&self.promised.expect("checked").leader)
            {
                return;
            }
            if self.yield_ticks < self.patience.saturating_mul(2) && self.yield_to.is_some() {
                return;
            }
            let round = self.max_round.max(self.promised.map_or(0, |p| p.round)) + 1;
            self.max_round = round;
            let ballot = Ballot { round, leader: self.me };
            self.promised = Some(ballot);
            let mut got = BTreeMap::new();
            got.insert(self.me, PromiseInfo { accepted: self.accepted.clone(), received: received.to_vec() });
            self.lead = Some(Lead { ballot, phase: Phase::Promises(got), ticks: 0 });
            // Every other member hears it, suspected ones too: a live one
            // that suspects this member back then yields instead of
            // competing with its own ballots.
            for &m in &view.members {
                if m != self.me {
                    self.outbox.push((m, ControlMsg::Prepare { view: view.id, ballot }));
                }
            }
        }
        let lead = self.lead.as_ref().expect("leading");
        let ballot = lead.ballot;
        match &lead.phase {
            Phase::Promises(got) => {
                if !self.trusted().all(|m| got.contains_key(&m)) {
                    return;
                }
                let promisers: Vec<MemberId> = self.trusted().collect();
                assert!(promisers.len() >= view.majority(), "a promise quorum is a majority of the view");
                let adopted = got.values().filter_map(|p| p.accepted.as_ref()).max_by_key(|(b, _)| *b);
                let decision = match adopted {
                    Some((_, d)) => d.clone(),
                    None => self.fresh_decision(&promisers, got),
                };
                assert!(self.decision_ok(&decision), "a proposed decision fits the view");
                self.accepted = Some((ballot, decision.clone()));
                let mut accepted = BTreeSet::new();
                accepted.insert(self.me);
                // Acceptors are the view's members (joiners are not); the
                // suspected hear it too (see the prepare).
                for &m in &view.members {
                    if m != self.me {
                        let msg = ControlMsg::Accept { view: view.id, ballot, decision: decision.clone() };
                        self.outbox.push((m, msg));
                    }
                }
                self.lead = Some(Lead { ballot, phase: Phase::Accepts { decision, accepted }, ticks: 0 });
                self.drive(received);
            }
            Phase::Accepts { decision, accepted } => {
                let waiting = decision
                    .next
                    .members
                    .iter()
                    .any(|m| view.contains(*m) && !accepted.contains(m) && !self.suspects.contains(m));
                if waiting || accepted.len() < view.majority() {
                    return;
                }
                let decision = decision.clone();
                self.learn(decision);
            }
        }
    }

    /// Next view = the promisers in rank order, then the joiners by id;
    /// trim = per subgroup and sender the minimum count over the promisers
    /// in the subgroup.
    fn fresh_decision(&self, promisers: &[MemberId], got: &BTreeMap<MemberId, PromiseInfo>) -> Decision {
        let mut members: Vec<MemberId> =
            self.group.view.members.iter().copied().filter(|m| promisers.contains(m)).collect();
        let mut incarnations: Vec<u64> =
            members.iter().map(|m| self.incarnation_of.get(m).copied().unwrap_or(0)).collect();
        for (&j, &inc) in &self.joiners {
            if !self.group.view.contains(j) && self.template.members.contains(&j) {
                members.push(j);
                incarnations.push(inc);
            }
        }
        let next = View { id: self.group.view.id + 1, members };
        // The catalogue: this view's, with the declarations heard applied
        // (by declarer, each in arrival order; one still pending — the
        // catalogue full — waits for a later view).
        let mut catalogue = self.template.clone();
        for (&m, list) in &self.declared {
            for d in list {
                apply_declaration(&mut catalogue, m, d);
            }
        }
        let trims = self
            .group
            .config
            .subgroups
            .iter()
            .enumerate()
            .map(|(g, s)| {
                let mut trim: Option<Vec<u64>> = None;
                for m in s.members.iter().filter(|m| promisers.contains(m)) {
                    let c = &got[m].received[g];
                    trim = Some(match trim {
                        None => c.clone(),
                        Some(t) => t.iter().zip(c).map(|(a, b)| *a.min(b)).collect(),
                    });
                }
                trim.unwrap_or_default()
            })
            .collect();
        Decision { next, trims, incarnations, subgroups: catalogue.subgroups }
    }

    /// The decision of the current view is known: install it or stop.
    fn learn(&mut self, decision: Decision) {
        let old = self.group.clone();
        let v = old.view.id;
        assert_eq!(decision.next.id, v + 1, "a decision moves to the next view");
        // Relay the commit once: if the leader died while sending it, the
        // members it did not reach learn it from those it did. Joiners are
        // told too.
        for &m in old.view.members.iter().chain(decision.joiners(&old.view).iter()) {
            if m != self.me {
                self.outbox.push((m, ControlMsg::Commit { view: v, decision: decision.clone() }));
            }
        }
        self.decisions.insert(v, decision.clone());
        while self.decisions.len() > KEPT_DECISIONS {
            let first = *self.decisions.keys().next().expect("non-empty");
            self.decisions.remove(&first);
            self.unacked.remove(&first);
        }
        if !decision.next.contains(self.me) {
            self.status = Status::Removed;
            self.events.push(ViewEvent::Removed { view: old.view, next: decision.next });
            return;
        }
        let waiting: BTreeSet<MemberId> = decision
            .next
            .members
            .iter()
            .copied()
            .filter(|m| *m != self.me && !self.suspects.contains(m))
            .collect();
        if self.lead.is_some() && !waiting.is_empty() {
            self.unacked.insert(v, waiting);
        }
        debug_assert!(extends(&self.template.subgroups, &decision.subgroups), "a catalogue only grows");
        self.template.subgroups = decision.subgroups.clone();
        self.group = allocate(&self.template, &decision.next);
        self.incarnation_of =
            decision.next.members.iter().copied().zip(decision.incarnations.iter().copied()).collect();
        self.joiners.clear();
        self.declared.clear();
        self.suspects.clear();
        self.reports.clear();
        self.silent.clear();
        self.heard.clear();
        self.minority_ticks = None;
        self.wedged = false;
        self.leaving = false;
        self.promised = None;
        self.accepted = None;
        self.lead = None;
        self.max_round = 0;
        self.waiting_ticks = 0;
        self.yield_ticks = u32::MAX;
        self.yield_to = None;
        self.events.push(ViewEvent::Install { old, decision });
        self.settle_own();
    }

    /// Acknowledges the installed view to its members (whoever retransmits
    /// its commit stops); the member calls it after applying
    /// [`ViewEvent::Install`].
    pub fn installed(&mut self) {
        let v = self.group.view.id;
        assert!(v > 0, "installed only after a view change");
        self.broadcast(ControlMsg::Installed { view: v - 1 });
    }
}

#[cfg(test)]
mod tests;
