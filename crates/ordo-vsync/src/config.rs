//! Group configuration: the top-level group, its subgroups, and the Spindle
//! switches.

use ordo_fabric::MemberId;
use serde::{Deserialize, Serialize};

/// How a subgroup delivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    /// Atomic multicast: round-robin total order, delivered once every
    /// member has received (spindle §II-D).
    #[default]
    Ordered,
    /// Delivered on receipt, in each sender's FIFO order, with no stability
    /// wait (the DDS `Unordered` QoS).
    Unordered,
}

/// One subgroup (a shard of the top-level group).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubgroupConfig {
    /// Members, a subset of the top-level group.
    pub members: Vec<MemberId>,
    /// Senders, in rank order; a subset of `members`. Members that never
    /// send are left out (spindle §III-B): they cost no null-sends.
    pub senders: Vec<MemberId>,
    /// Slots per sender ring (`w`).
    pub window: usize,
    /// Largest message payload in bytes.
    pub max_payload: usize,
    /// Ordered (default) or unordered delivery.
    #[serde(default)]
    pub mode: DeliveryMode,
    /// The subgroup's name: what members declare to join it at run time
    /// ([`crate::view::Declaration`]; ordo-dds: the topic's name). Empty for
    /// an anonymous configured subgroup; at most [`MAX_NAME`] bytes, unique
    /// in the group when not empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The application's description of the subgroup, opaque to vsync and
    /// agreed with its name (ordo-dds: the topic's QoS level, history and
    /// type); at most [`MAX_DESCRIPTOR`] bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptor: Vec<u8>,
}

impl SubgroupConfig {
    /// Whether `other` has this subgroup's shape: descriptor, window,
    /// payload and delivery mode (what members must agree on to share it;
    /// names and membership aside).
    pub fn same_shape(&self, other: &SubgroupConfig) -> bool {
        self.window == other.window
            && self.max_payload == other.max_payload
            && self.mode == other.mode
            && self.descriptor == other.descriptor
    }
}

/// The Spindle optimizations, each a switch (spindle §III). All on is
/// Spindle; all off is the baseline of the paper's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Switches {
    /// §III-A: the send predicate pushes every ready contiguous slot in one
    /// write (two on wrap); off: one message per push.
    pub send_batching: bool,
    /// §III-A: the receive predicate takes every new message of every sender
    /// in one scan and pushes `received_num` once; off: one message per
    /// predicate evaluation, one push each.
    pub receive_batching: bool,
    /// §III-A: the delivery predicate delivers everything stable at once and
    /// pushes `delivered_num` once; off: one message per evaluation.
    pub delivery_batching: bool,
    /// §III-B: a sender that receives M(j,k) while its own round is behind
    /// sends one null (a count) so that delivery does not wait for it.
    pub null_sends: bool,
    /// §III-C: pushes are posted after the predicate releases the group
    /// lock; off: posted while holding it. (Executed by the runtime.)
    pub post_after_unlock: bool,
    /// §III-A end: application threads acquire slots and build messages in
    /// place without locks; off: they take the group lock to send.
    /// (Executed by the runtime.)
    pub lock_free_send: bool,
    /// §III-D: one upcall per delivered batch; off: one per message.
    /// (Executed by the runtime.)
    pub batched_upcall: bool,
    /// Not in the paper (what Aeron IPC and Cyclone DDS with iceoryx give
    /// their users): when the fabric gives this member every other member's
    /// own region (shm: all on one host), receivers read a sender's ring —
    /// counter and slots — in the sender's region, and the send predicate
    /// posts nothing: a multicast to N members costs no copy per receiver.
    /// Slot reuse already waits for delivery at every member. Off by
    /// default; a fixed group only (`VsyncMember`): views copy.
    pub zero_copy: bool,
    /// Not in the paper (its §III-A sends data, then the counter): where the
    /// fabric is address-ordered (`Fabric::address_ordered`; the driver
    /// turns this off where it is not), each ring slot carries a trailer
    /// stamp that is its own guard and a send push is one write — no
    /// counter write (`ordo_ring`, "Stamped rings"). On in Spindle, off in
    /// the baseline. Every member must agree (one backend, one
    /// architecture).
    pub stamped_slots: bool,
}

impl Switches {
    /// Every Spindle optimization on.
    pub const SPINDLE: Switches = Switches {
        send_batching: true,
        receive_batching: true,
        delivery_batching: true,
        null_sends: true,
        post_after_unlock: true,
        lock_free_send: true,
        batched_upcall: true,
        zero_copy: false,
        stamped_slots: true,
    };

    /// Every optimization off: the baseline of spindle §IV.
    pub const BASELINE: Switches = Switches {
        send_batching: false,
        receive_batching: false,
        delivery_batching: false,
        null_sends: false,
        post_after_unlock: false,
        lock_free_send: false,
        batched_upcall: false,
        zero_copy: false,
        stamped_slots: false,
    };
}

impl Default for Switches {
    fn default() -> Self {
        Switches::SPINDLE
    }
}

/// The top-level group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Every member of the top-level group.
    pub members: Vec<MemberId>,
    /// Its subgroups.
    pub subgroups: Vec<SubgroupConfig>,
    /// The Spindle switches.
    #[serde(default)]
    pub switches: Switches,
}

/// A configuration mistake.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Something about subgroup `subgroup` is wrong.
    #[error("subgroup {subgroup}: {why}")]
    Subgroup {
        /// Index of the subgroup.
        subgroup: usize,
        /// What is wrong.
        why: String,
    },
    /// The member list is wrong.
    #[error("group: {0}")]
    Group(String),
}

/// Largest window (slots per sender) a subgroup may have.
pub const MAX_WINDOW: usize = 1 << 16;
/// Largest payload a slot may hold.
pub const MAX_PAYLOAD: usize = 1 << 24;
/// Longest subgroup name, in bytes.
pub const MAX_NAME: usize = 255;
/// Longest subgroup descriptor, in bytes.
pub const MAX_DESCRIPTOR: usize = 1024;

impl GroupConfig {
    /// Checks the configuration (at least one subgroup).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.subgroups.is_empty() {
            return Err(ConfigError::Group("no subgroups".into()));
        }
        self.validate_view()
    }

    /// Checks the configuration of one view: as [`validate`](Self::validate)
    /// but a view may have no active subgroup (every sender of each one
    /// left; see [`crate::view::allocate`]).
    pub fn validate_view(&self) -> Result<(), ConfigError> {
        self.check(false)
    }

    /// Checks the configured group of a member that changes views (the
    /// template every view is allocated from, [`crate::view::allocate`]):
    /// as [`validate_view`](Self::validate_view), but it may have no
    /// subgroup yet, and a subgroup may have no sender yet (it is inactive
    /// until one joins it: subgroups grow by declarations).
    pub fn validate_template(&self) -> Result<(), ConfigError> {
        self.check(true)
    }

    fn check(&self, template: bool) -> Result<(), ConfigError> {
        let mut members = self.members.clone();
        members.sort_unstable();
        members.dedup();
        if members.len() != self.members.len() || members.is_empty() {
            return Err(ConfigError::Group(format!(
                "members {:?} must be non-empty and distinct",
                self.members
            )));
        }
        for (g, s) in self.subgroups.iter().enumerate() {
            let bad = |why: String| Err(ConfigError::Subgroup { subgroup: g, why });
            let mut m = s.members.clone();
            m.sort_unstable();
            m.dedup();
            if m.len() != s.members.len() || m.is_empty() {
                return bad(format!("members {:?} must be non-empty and distinct", s.members));
            }
            if let Some(x) = s.members.iter().find(|x| !self.members.contains(x)) {
                return bad(format!("member {x} is not in the top-level group"));
            }
            let mut snd = s.senders.clone();
            snd.sort_unstable();
            snd.dedup();
            if snd.len() != s.senders.len() || (snd.is_empty() && !template) {
                return bad(format!("senders {:?} must be non-empty and distinct", s.senders));
            }
            if let Some(x) = s.senders.iter().find(|x| !s.members.contains(x)) {
                return bad(format!("sender {x} is not a member of the subgroup"));
            }
            if s.window == 0 || s.window > MAX_WINDOW {
                return bad(format!("window {} must be in 1..={MAX_WINDOW}", s.window));
            }
            if s.max_payload == 0 || s.max_payload > MAX_PAYLOAD {
                return bad(format!("max_payload {} must be in 1..={MAX_PAYLOAD}", s.max_payload));
            }
            if s.name.len() > MAX_NAME || s.descriptor.len() > MAX_DESCRIPTOR {
                return bad(format!(
                    "a name of at most {MAX_NAME} bytes and a descriptor of at most {MAX_DESCRIPTOR}"
                ));
            }
            if !s.name.is_empty() && self.subgroups[..g].iter().any(|o| o.name == s.name) {
                return bad(format!("the name {:?} is taken by an earlier subgroup", s.name));
            }
        }
        Ok(())
    }
}
