//! The replication engine under the RESP front end (`kv.engine`): acuerdo
//! (the default: the group's member on the fabric, [`AcuerdoEngine`]) or
//! raft (R3P2: Raft behind R2P2's `REPLICATED_ROUTE`, [`crate::raft`]).
//! Both order the same [`crate::state::Entry`]s into the same
//! [`crate::state::KvState`]: one key-value state machine, two engines.
//!
//! # Contract the front end relies on
//! - [`Engine::submit`] is called only while [`EngineStatus::is_leader`];
//!   entries submitted in a row are ordered in that order.
//! - A write's reply reaches the front end through the applied results
//!   (the replica whose front end took it applies it, whichever replica
//!   led); its ticket's event only settles it: `Committed` (the reply came
//!   or comes through the results), `Lost` (certainly not applied), `Unknown`
//!   (maybe applied), `Retry` (refused for back-pressure; submit again),
//!   `Refused` (certainly not applied, with why).
//! - A read barrier ([`Engine::read_barrier`]) is `ReadReady` once this
//!   replica's table reflects every write committed before it was asked
//!   for, so reads answered from it are linearizable; `ReadFailed` hands
//!   the reads on (to the leader).

use ordo_fabric::MemberId;
use ordo_runtime::acuerdo::{AcuerdoClient, ClientEvent, SubmitError};

/// How a ticket settled (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EngineEvent {
    Committed(u64),
    Lost(u64),
    Unknown(u64),
    Retry(u64),
    NotLeader(u64),
    Refused(u64, String),
    ReadReady(u64),
    ReadFailed(u64),
}

/// What the front end shows (INFO, status, forwarding).
#[derive(Clone, Debug, Default)]
pub(crate) struct EngineStatus {
    pub is_leader: bool,
    /// The leader's member id, if known.
    pub leader: Option<MemberId>,
    /// `leader`, `follower`, `candidate`, ...
    pub role: String,
    /// The acuerdo epoch's round or the Raft term.
    pub term: u64,
    /// The epoch or term, printed.
    pub epoch: String,
    /// Committed, printed (a header or a log index).
    pub committed: String,
    /// Entries applied here.
    pub delivered: u64,
    /// Elections this replica won (acuerdo) or 0.
    pub elections: u64,
}

/// A replication engine as the front end drives it.
pub(crate) trait Engine: Send {
    /// Proposes an encoded entry; its ticket.
    fn submit(&mut self, entry: &[u8]) -> Result<u64, SubmitError>;
    /// Asks for a read barrier; its ticket.
    fn read_barrier(&mut self) -> Result<u64, SubmitError>;
    /// The next settled ticket, if any.
    fn poll(&mut self) -> Option<EngineEvent>;
    /// Leadership and progress, printed (INFO, the status endpoint).
    fn status(&self) -> EngineStatus;
    /// Whether this replica takes writes itself (asked per command: no
    /// allocation), and the leader it knows of.
    fn leadership(&self) -> (bool, Option<MemberId>);
}

/// The acuerdo member's client queue as an [`Engine`].
pub(crate) struct AcuerdoEngine(pub AcuerdoClient);

impl Engine for AcuerdoEngine {
    fn submit(&mut self, entry: &[u8]) -> Result<u64, SubmitError> {
        self.0.submit(entry)
    }

    fn read_barrier(&mut self) -> Result<u64, SubmitError> {
        self.0.read_barrier()
    }

    fn poll(&mut self) -> Option<EngineEvent> {
        loop {
            let ev = self.0.poll()?;
            return Some(match ev {
                ClientEvent::Accepted { .. } => continue,
                ClientEvent::Committed { ticket, .. } => EngineEvent::Committed(ticket),
                ClientEvent::Lost { ticket, .. } => EngineEvent::Lost(ticket),
                ClientEvent::Unknown { ticket, .. } => EngineEvent::Unknown(ticket),
                ClientEvent::Rejected { ticket, error } => match error {
                    ordo_acuerdo::BroadcastError::WouldBlock => EngineEvent::Retry(ticket),
                    ordo_acuerdo::BroadcastError::NotLeader { .. } => EngineEvent::NotLeader(ticket),
                    e => EngineEvent::Refused(ticket, e.to_string()),
                },
                ClientEvent::ReadReady { ticket } => EngineEvent::ReadReady(ticket),
                ClientEvent::ReadFailed { ticket, .. } => EngineEvent::ReadFailed(ticket),
            });
        }
    }

    fn leadership(&self) -> (bool, Option<MemberId>) {
        let st = self.0.status();
        (st.is_leader(), st.leader())
    }

    fn status(&self) -> EngineStatus {
        let st = self.0.status();
        EngineStatus {
            is_leader: st.is_leader(),
            leader: st.leader(),
            role: format!("{:?}", st.role()).to_lowercase(),
            term: u64::from(st.epoch().round),
            epoch: format!("{:?}", st.epoch()),
            committed: format!("{:?}", st.committed()),
            delivered: st.delivered(),
            elections: st.elections_won(),
        }
    }
}
