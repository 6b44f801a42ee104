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
//! notification. The runtime and the seeded simulation (`ordo-simulation`) both drive
//! an [`AcuerdoDriver`].
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
//!   leader streams to a laggard from its log as slots free up
//!   (receiver-side batching catch-up, §3), or by state transfer once GC
//!   dropped what it lacks. Diffs travel as one ring message per snapshot
//!   chunk and per entry plus an end marker, so a diff of any size fits.
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
//!   (`diff_request`), which carries a snapshot once the log was
//!   truncated (see "State transfer" below). Safety needs at most f members crashed *or still
//!   catching up* at any time.
//! - **Abdication.** A leader that sees a live member promised to a bigger
//!   epoch (one that voted for a candidate that lost) starts a new
//!   election, so that member can rejoin; followers follow the leader into
//!   it.
//! - **Leader bit.** A member's row says whether it leads (status bit 1);
//!   followers suspect their leader when its heartbeat stops *or* its row
//!   stops claiming the epoch, so a leader that restarted (whose new
//!   incarnation heartbeats again) is not taken for alive.
//! - **Periodic commit pushes** (Fig. 6). A changed Commit column is
//!   pushed at most every [`Config::commit_push_interval_ns`] (or with any
//!   other row push), so commit pushes stay off the critical path; Accept
//!   and ring acks go out at once.
//! - **Transient delays.** A member that timed out but never moved past its
//!   epoch returns to following when its leader's heartbeat resumes.
//!
//! # Log garbage collection and state transfer ([`Config::log_gc`], on by default)
//! - **What is dropped.** After committing, every synced member drops the
//!   log entries at or below the *GC floor*: the smallest Commit column
//!   over the rows of members it does not suspect (heartbeat within the
//!   timeout; its own row: `Committed`), and, at the leader, never above
//!   the last entry a live member's ring stream has sent (what a stream has
//!   still to send stays). The largest dropped header is the *log floor*
//!   ([`Engine::log_floor`]); it never exceeds `Committed`, so nothing
//!   undelivered is dropped. A crashed member no longer pins the log.
//!   Collection runs in batches, once the log holds 16 entries.
//! - **State transfer.** The application is a [`DeliverySink`] with
//!   [`DeliverySink::snapshot`] (its state after the delivered prefix) and
//!   [`DeliverySink::restore`]. A diff for member `r` starts after `r`'s
//!   Commit header; if that header is below the sender's log floor (a
//!   suspected member was skipped by GC, or `r` restarted and asks for a
//!   full diff), the diff instead opens with a snapshot the leader takes at
//!   its own `Committed` header `S`, sent as chunks of `max_payload` bytes
//!   (one ring message each, like diff entries, so a snapshot of any size
//!   fits the fixed slots), then the log entries in `(S, upto]`, then the
//!   end marker with `base = S`. A leader's stream to a suspected member
//!   that falls below the new floor is replaced by such a diff.
//! - **New invariants.** (1) A snapshot covers exactly a committed prefix:
//!   the leader takes it inside `poll`, after delivering up to `S =
//!   Committed`, and `S ≤ upto ≤` its Accepted. (2) A follower applies a
//!   diff whose `base` is above its `Committed` only with a complete
//!   snapshot of that diff (every chunk of the same serial, in order, of
//!   the announced length, for header `base`), and otherwise rejects it and
//!   asks again: it never delivers with a gap. (3) On restore it drops its
//!   whole log (below `S` it is superseded, above it uncommitted), sets
//!   `Committed = S` and its log floor to `S`, and delivers what follows
//!   `S` one by one: no message is delivered twice by an incarnation and
//!   the order is the leader's. (4) The leader keeps every entry in
//!   `(S, upto]` until the stream sent it (the GC floor never passes a live
//!   stream), so the suffix has no gap. (5) A diff whose base is at or
//!   below the follower's `Committed` ignores its snapshot. The election is
//!   unchanged: a winner holds every committed message in its log or below
//!   its log floor, which its own application state covers (delivered or
//!   restored), so its snapshots and diffs lose nothing committed.
//! - **Why dropping entries of a suspected member is safe.** Such a member
//!   either returns and receives a diff that carries what it lacks (the
//!   log suffix after its Commit header, or a snapshot plus suffix), or
//!   restarts and asks for a full one; a diff never claims to reach back
//!   below its sender's floor without a snapshot.
//! - **Cost.** A snapshot is taken once per poll that needs one (shared by
//!   every such diff of that poll) and held until its diff is sent; a
//!   follower stages it (and the diff's entries) until the end marker.
//!   With the default [`DeliverySink`] methods (an application without
//!   state) the snapshot is empty: a restarted member then delivers only
//!   what follows it. Operators watch [`Engine::log_len`]: under load the
//!   log stays within the outstanding window plus what the slowest live
//!   member has not yet committed; a restarted member pins it while it
//!   catches up.
//!
//! # Durable mode ([`Config::durable`], off by default)
//! The paper's members keep everything in memory: committed means a quorum
//! holds it in memory. In durable mode the engine hands the application,
//! once per poll and before its commit step, every log change and promise
//! of the poll ([`DeliverySink::persist`], a [`Persist`]); pushes leave
//! only after `poll` returns, so no Accept, vote or E_new reaches a peer
//! before it is durable, and the leader's own Accept is durable when the
//! commit rule counts it: a committed message is durable at a quorum. A
//! member restarted from what it wrote ([`Engine::recover`], a
//! [`Recovered`]) holds its promises and its log: it is synced at once,
//! may follow the leader of its last stored epoch again, and never wins an
//! epoch it was already in (it may have led it). A power loss of every
//! member loses nothing acknowledged: the `kv` simulation cuts power to the
//! whole group in half its seeds and checks the clients' history.
//!
//! # Limits
//! Member ids ≤ 255, rounds < 2^24, counts < 2^32 per epoch, up to 15
//! members, incarnations < 2^15. Without [`Config::log_gc`] the log is kept
//! whole and a restarted member is caught up from it. A follower stages a
//! diff's entries and snapshot until its end marker.
//! Memory per ring is fixed by `window × (max_payload + 32)`.

#![warn(missing_docs)]

pub mod config;
mod driver;
mod engine;
pub mod header;

pub use config::{Columns, Config, ConfigError, Layout, MAX_EPOCH_MESSAGES};
pub use driver::{AcuerdoDriver, Settled, URGENT_RUN_MAX};
pub use engine::{
    BroadcastError, DeliverySink, Effects, Engine, MAX_PENDING_READS, Note, Persist, Push, Recovered, Role,
    Target,
};
pub use header::{Epoch, Header, Vote};
