//! Acuerdo: leader-based atomic broadcast over one-sided writes (acuerdo
//! §3, Figs. 4-7; DESIGN.md §4), as a sans-I/O engine.
//!
//! A group of n = 2f+1 members. In each **epoch** `(round, leader)` one
//! leader assigns **headers** `(epoch, count)` to client messages and sends
//! them to every follower through slot rings ([`ordo_ring`]); followers
//! accept the messages of their current epoch and publish only the latest
//! header they accepted in the Accept column of the SST ([`ordo_sst`]); the
//! leader commits a header once a quorum's Accept of the current epoch
//! reaches it and publishes its Commit, which the followers follow. When
//! the leader's heartbeat stops, the fixed-point **election** of Fig. 7
//! elects a leader that is up to date, which then sends each follower a
//! **diff** with the messages it lacks after its committed header (§3.4).
//!
//! The engine does no I/O: [`Engine::poll`] takes the time, reads the local
//! region, hands committed messages to a [`DeliverySink`] and returns the
//! writes to post as [`Push`] effects. [`Engine::broadcast`] is the client
//! API (leader only; a [`BroadcastError::NotLeader`] names the leader to
//! redirect to; a bounded window of outstanding messages answers
//! [`BroadcastError::WouldBlock`]); [`Effects::committed`] is the commit
//! notification. The `tests/` directory runs the engine under `ordo-sim`.
//!
//! # Invariants (the paper's and this implementation's)
//! - **One leader per epoch.** An epoch names its leader, and only that
//!   member wins it: with a quorum of votes equal to its own (§3.3, Fig. 7
//!   line 114). A member never votes twice for different votes of the same
//!   epoch (votes only grow).
//! - **The elected leader is up to date** (§3.3): a member joins a vote only
//!   if its own Accepted ≤ the candidate's (rule 2), so the winner's log
//!   holds every message its quorum of voters accepted, hence every
//!   committed one (a commit needs a quorum of accepts, and two quorums
//!   meet). It never fetches state; its first message per follower is a diff.
//!   "Before its epoch" matters: a member may move its vote to a bigger
//!   epoch after a candidate of a smaller one counted it, so that candidate
//!   can still win its smaller epoch after the bigger one committed; it can
//!   commit nothing (a quorum promised the bigger epoch and rejects its
//!   diff), and it abdicates once it sees the bigger promise.
//! - **The committed prefix is never lost** (§3.4): a follower applies a
//!   diff only if it promised no bigger epoch (`E_new ≤ e`) and the diff
//!   reaches back to its Committed header; it then drops only its
//!   uncommitted suffix. Committed headers are delivered once, in order.
//! - **Monotonic SST columns** (§3.2): Accept, Commit, E_new, the vote
//!   (as a pair), heartbeat, ring acks and sessions only grow within an
//!   incarnation of the row's owner, so late or repeated pushes are
//!   harmless. The vote's second word alone is not monotonic, which is why
//!   columns are raw words (see [`config`]) and the vote carries a check
//!   word against tearing ([`header`]).
//! - **Slot reuse**: one ring per ordered pair of members; a slot of the
//!   ring to `r` is reused once `r` consumed its message in the same
//!   session (`ring_ack`). A dead follower blocks only its own ring; the
//!   leader keeps its log and streams to a laggard from it as slots free up
//!   (receiver-side batching catch-up, §3). Diffs travel as one ring message
//!   per entry plus an end marker, so a diff of any size fits.
//!
//! # Beyond the paper
//! - **Link resets.** After the fabric reconnects a link (writes may have
//!   been lost, or the peer is a new incarnation with a zeroed region) the
//!   sender starts a new ring *session*: it zeroes the receiver's ring
//!   counter, then publishes the new session number; slots carry the session
//!   in their flags, so a receiver never mixes sessions. A leader starts
//!   every session with a fresh diff.
//! - **Restarts** (empty state). A restarted member forgot its promises and
//!   acceptances: it does not vote until it holds a leader's log; it first
//!   hears from f+1 synced members and raises `E_new` to the largest epoch
//!   they show (this bounds every promise it made before: any quorum that
//!   counted it holds f others), then asks the leader for a full diff
//!   (`diff_request`). Safety needs at most f members crashed *or still
//!   catching up* at any time.
//! - **Abdication.** A leader that sees a live member promised to a bigger
//!   epoch (one that voted for a candidate that lost) starts a new
//!   election, so that member can rejoin; followers follow the leader into
//!   it.
//! - **Leader bit.** A member's row says whether it leads (status bit 1);
//!   followers suspect their leader when its heartbeat stops *or* its row
//!   stops claiming the epoch, so a leader that restarted (whose new
//!   incarnation heartbeats again) is not taken for alive.
//! - **Transient delays.** A member that timed out but never moved past its
//!   epoch returns to following when its leader's heartbeat resumes.
//!
//! # Log garbage collection ([`Config::log_gc`], off by default)
//! - **What is dropped.** After committing, every synced member drops the
//!   log entries at or below the smallest Commit column over *all* rows of
//!   its SST (its own row: `Committed`): messages committed everywhere. The
//!   largest dropped header is the *log floor* ([`Engine::log_floor`]); the
//!   floor never exceeds `Committed`, so nothing undelivered is dropped.
//! - **Why it is safe.** A diff for member `r` (§3.4) carries the entries
//!   after `r`'s Commit header. Commit columns only grow within an
//!   incarnation and a member's copy of a row only lags the owner's, so
//!   every current incarnation's Commit is ≥ the floor of every member
//!   (leader or future leader) that dropped entries: GC keeps everything a
//!   diff for it needs. A diff never claims to reach back below the
//!   sender's floor (its `base` is at least the floor), so a member that
//!   needs older entries rejects it instead of delivering with a gap.
//! - **Limits (no state transfer yet).** A member that restarts with empty
//!   state needs the whole history, which a truncated log no longer holds:
//!   with GC on it keeps rejecting the leader's diffs and re-asking, stays
//!   unsynced and never votes (safe, it counts as one of the f unsafe
//!   members, but it never rejoins). A crashed member's frozen Commit
//!   column pins the floor, so the log grows again until it restarts or is
//!   removed from the configuration (membership change is a later issue).
//!   Operators watch [`Engine::log_len`]. Under failure-free load the log
//!   stays within the outstanding window plus what the slowest member has
//!   not yet committed.
//!
//! # Limits
//! Member ids ≤ 255, rounds < 2^24, counts < 2^32 per epoch, up to 15
//! members, incarnations < 2^15. Without [`Config::log_gc`] the log is kept
//! whole; a restarted member is caught up from it, and a follower stages a
//! diff's entries until its end marker (bounded by the leader's log).
//! Memory per ring is fixed by `window × (max_payload + 32)`.

#![warn(missing_docs)]

pub mod config;
mod engine;
pub mod header;

pub use config::{Columns, Config, ConfigError, Layout};
pub use engine::{BroadcastError, DeliverySink, Effects, Engine, Note, Push, Role, Target};
pub use header::{Epoch, Header, Vote};

// The simulation workload lives with the tests (tests/common) and is also
// compiled into the library under the `sim` feature, so the CLI can replay
// a seed. It names this crate `ordo_acuerdo`, as an integration test does.
#[cfg(feature = "sim")]
extern crate self as ordo_acuerdo;

/// The seeded simulation workload and its checkers (feature `sim`). Its
/// event fields are described on their variants (test-harness style).
#[cfg(feature = "sim")]
#[allow(missing_docs)]
#[path = "../tests/common/mod.rs"]
pub mod sim;
