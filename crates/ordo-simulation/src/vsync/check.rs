//! The vsync workload's checkers: pure functions of the recorded history
//! (see the parent module for what each one checks).
#![allow(unused_imports)]

use super::*;

#[derive(Clone, Copy, Debug)]
pub(super) struct Del {
    pub(super) time_ns: u64,
    pub(super) sender: MemberId,
    pub(super) seq: i64,
    pub(super) round: u64,
    pub(super) len: u32,
    pub(super) digest: u64,
}

/// (subgroup, member) → what that member did there.
pub(super) type PerMember<T> = BTreeMap<(usize, MemberId), T>;

/// The history sorted out by subgroup and member.
#[derive(Default)]
pub(super) struct Parsed {
    /// (subgroup, sender) → (index, len, digest) in recording order.
    pub(super) sent: PerMember<Vec<(u64, u32, u64)>>,
    /// (subgroup, member) → deliveries in order.
    pub(super) delivered: PerMember<Vec<Del>>,
    /// (subgroup, member) → (time, rounds).
    pub(super) nulls: PerMember<Vec<(u64, u64)>>,
    /// (subgroup, member) → rounds declared.
    pub(super) declared: PerMember<u64>,
    /// member → last finished marker.
    pub(super) finished: BTreeMap<MemberId, bool>,
    pub(super) anomalies: Vec<(MemberId, u64, String)>,
}

impl Parsed {
    fn of(h: &History<VsyncEvent>) -> Parsed {
        let mut p = Parsed::default();
        for e in &h.entries {
            let m = e.member;
            match &e.event {
                VsyncEvent::Declared { subgroup, rounds } => {
                    *p.declared.entry((*subgroup, m)).or_default() += rounds;
                }
                VsyncEvent::Sent { subgroup, sender, index, len, digest } => {
                    if *sender != m {
                        p.anomalies.push((m, e.time_ns, format!("Sent names sender m{sender}")));
                    }
                    p.sent.entry((*subgroup, m)).or_default().push((*index, *len, *digest));
                }
                VsyncEvent::Delivered { subgroup, sender, seq, round, len, digest } => {
                    p.delivered.entry((*subgroup, m)).or_default().push(Del {
                        time_ns: e.time_ns,
                        sender: *sender,
                        seq: *seq,
                        round: *round,
                        len: *len,
                        digest: *digest,
                    });
                }
                VsyncEvent::NullsSent { subgroup, rounds } => {
                    p.nulls.entry((*subgroup, m)).or_default().push((e.time_ns, *rounds));
                }
                VsyncEvent::Finished => {
                    p.finished.insert(m, true);
                }
                VsyncEvent::Resumed => {
                    p.finished.insert(m, false);
                }
                VsyncEvent::Backpressure { .. } => {}
                VsyncEvent::Anomaly { what } => p.anomalies.push((m, e.time_ns, what.clone())),
            }
        }
        p
    }

    fn sent_count(&self, g: usize, s: MemberId) -> u64 {
        self.sent.get(&(g, s)).map_or(0, |v| v.len() as u64)
    }

    fn deliveries(&self, g: usize, m: MemberId) -> &[Del] {
        self.delivered.get(&(g, m)).map_or(&[], |v| v.as_slice())
    }

    /// Distinct rounds of `s` delivered anywhere in `g`, ascending.
    fn rounds_of(&self, g: usize, s: MemberId) -> Vec<u64> {
        let set: BTreeSet<u64> = self
            .delivered
            .iter()
            .filter(|((sg, _), _)| *sg == g)
            .flat_map(|(_, v)| v.iter().filter(|d| d.sender == s).map(|d| d.round))
            .collect();
        set.into_iter().collect()
    }
}

pub(super) fn rank(group: &GroupConfig, g: usize, s: MemberId) -> Option<usize> {
    group.subgroups.get(g)?.senders.iter().position(|x| *x == s)
}

/// No anomaly recorded; `Sent` indices are 0, 1, 2, ... per sender; only
/// senders of a subgroup send or declare in it.
pub struct Anomalies {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for Anomalies {
    fn name(&self) -> &'static str {
        "vsync-anomalies"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        let bad = |m: String| Err(Violation::new(self.name(), m));
        if let Some((m, t, what)) = p.anomalies.first() {
            return bad(format!("m{m} at {t} ns: {what}"));
        }
        for (&(g, s), sent) in &p.sent {
            if rank(&self.group, g, s).is_none() {
                return bad(format!("m{s} sent in subgroup {g}, where it is not a sender"));
            }
            if let Some((i, (k, _, _))) = sent.iter().enumerate().find(|(i, (k, _, _))| *k != *i as u64) {
                return bad(format!("m{s} recorded message {k} of subgroup {g} as its message number {i}"));
            }
        }
        for &(g, s) in p.declared.keys() {
            if rank(&self.group, g, s).is_none() {
                return bad(format!("m{s} declared inactivity in subgroup {g}, where it is not a sender"));
            }
        }
        Ok(())
    }
}

/// Every delivered payload was sent with exactly those bytes (see the
/// module docs).
pub struct Integrity {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for Integrity {
    fn name(&self) -> &'static str {
        "vsync-integrity"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        let bad = |m: String| Err(Violation::new(self.name(), m));
        // (subgroup, sender) → round → (len, digest, first member).
        let mut seen: PerMember<BTreeMap<u64, (u32, u64, MemberId)>> = BTreeMap::new();
        for (&(g, m), dels) in &p.delivered {
            let Some(sub) = self.group.subgroups.get(g) else {
                return bad(format!("m{m} delivered in subgroup {g}, which does not exist"));
            };
            if !sub.members.contains(&m) {
                return bad(format!("m{m} delivered in subgroup {g} but is not a member"));
            }
            for d in dels {
                if !sub.senders.contains(&d.sender) {
                    return bad(format!(
                        "m{m} delivered a message of m{} in subgroup {g}, where it is not a sender",
                        d.sender
                    ));
                }
                let rounds = seen.entry((g, d.sender)).or_default();
                match rounds.get(&d.round) {
                    Some(&(len, digest, first)) if (len, digest) != (d.len, d.digest) => {
                        return bad(format!(
                            "subgroup {g}, m{} round {}: m{first} delivered {len} bytes (digest {digest:#x}), \
                             m{m} {} bytes (digest {:#x})",
                            d.sender, d.round, d.len, d.digest
                        ));
                    }
                    Some(_) => {}
                    None => {
                        rounds.insert(d.round, (d.len, d.digest, m));
                    }
                }
            }
        }
        for (&(g, s), rounds) in &seen {
            let sent = p.sent.get(&(g, s)).map_or(&[][..], |v| v.as_slice());
            for (i, (round, &(len, digest, m))) in rounds.iter().enumerate() {
                let Some(&(_, slen, sdigest)) = sent.get(i) else {
                    return bad(format!(
                        "subgroup {g}: m{m} delivered a message of m{s} (round {round}), but m{s} sent only {} \
                         messages and rounds {:?} were delivered",
                        sent.len(),
                        rounds.keys().collect::<Vec<_>>()
                    ));
                };
                if (slen, sdigest) != (len, digest) {
                    return bad(format!(
                        "subgroup {g}: message {i} of m{s} (round {round}) was sent as {slen} bytes (digest \
                         {sdigest:#x}) but m{m} delivered {len} bytes (digest {digest:#x}), or an earlier \
                         message of m{s} was never delivered"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// No member delivers a message twice.
pub struct NoDuplication {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for NoDuplication {
    fn name(&self) -> &'static str {
        "vsync-no-duplication"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        for (&(g, m), dels) in &p.delivered {
            let mut set = BTreeSet::new();
            for d in dels {
                if !set.insert((d.sender, d.round)) {
                    return Err(Violation::new(
                        self.name(),
                        format!(
                            "m{m} delivered m{}'s round {} of subgroup {g} twice (second at {} ns)",
                            d.sender, d.round, d.time_ns
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Ordered subgroups: round-robin seqs, increasing, and every member's
/// sequence a prefix of every longer one.
pub struct TotalOrder {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for TotalOrder {
    fn name(&self) -> &'static str {
        "vsync-total-order"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        let bad = |m: String| Err(Violation::new(self.name(), m));
        for (g, sub) in self.group.subgroups.iter().enumerate() {
            if sub.mode != DeliveryMode::Ordered {
                continue;
            }
            let n = sub.senders.len() as u64;
            let mut longest: (MemberId, &[Del]) = (0, &[]);
            for &m in &sub.members {
                let dels = p.deliveries(g, m);
                let mut last = -1i64;
                for d in dels {
                    let Some(r) = rank(&self.group, g, d.sender) else { continue };
                    let want = (d.round * n + r as u64) as i64;
                    if d.seq != want {
                        return bad(format!(
                            "subgroup {g}: m{m} delivered m{} (rank {r}) round {} with seq {}, not {want}",
                            d.sender, d.round, d.seq
                        ));
                    }
                    if d.seq <= last {
                        return bad(format!(
                            "subgroup {g}: m{m} delivered seq {} after seq {last} (at {} ns)",
                            d.seq, d.time_ns
                        ));
                    }
                    last = d.seq;
                }
                if dels.len() > longest.1.len() {
                    longest = (m, dels);
                }
            }
            for &m in &sub.members {
                let dels = p.deliveries(g, m);
                if let Some(i) = (0..dels.len()).find(|&i| dels[i].seq != longest.1[i].seq) {
                    return bad(format!(
                        "subgroup {g}: m{m} and m{} disagree at position {i}: seq {} (m{} round {}) vs seq {} \
                         (m{} round {})",
                        longest.0,
                        dels[i].seq,
                        dels[i].sender,
                        dels[i].round,
                        longest.1[i].seq,
                        longest.1[i].sender,
                        longest.1[i].round
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Per sender FIFO without gaps at every member (every subgroup); seq -1 in
/// unordered subgroups.
pub struct Fifo {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for Fifo {
    fn name(&self) -> &'static str {
        "vsync-fifo"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        let bad = |m: String| Err(Violation::new(self.name(), m));
        for (g, sub) in self.group.subgroups.iter().enumerate() {
            let all: BTreeMap<MemberId, Vec<u64>> =
                sub.senders.iter().map(|&s| (s, p.rounds_of(g, s))).collect();
            for &m in &sub.members {
                let mut next: BTreeMap<MemberId, usize> = BTreeMap::new();
                for d in p.deliveries(g, m) {
                    if sub.mode == DeliveryMode::Unordered && d.seq != -1 {
                        return bad(format!("subgroup {g} is unordered but m{m} delivered seq {}", d.seq));
                    }
                    let Some(rounds) = all.get(&d.sender) else { continue };
                    let i = next.entry(d.sender).or_default();
                    if rounds.get(*i) != Some(&d.round) {
                        return bad(format!(
                            "subgroup {g}: m{m} delivered m{}'s round {} as its message {} from m{}, but the \
                             rounds of m{} are {:?}",
                            d.sender, d.round, *i, d.sender, d.sender, rounds
                        ));
                    }
                    *i += 1;
                }
            }
        }
        Ok(())
    }
}

/// Every message sent is delivered at every member of its subgroup, and
/// every member ends finished.
pub struct Liveness {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for Liveness {
    fn name(&self) -> &'static str {
        "vsync-liveness"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        let bad = |m: String| Err(Violation::new(self.name(), m));
        for (g, sub) in self.group.subgroups.iter().enumerate() {
            for &m in &sub.members {
                for &s in &sub.senders {
                    let sent = p.sent_count(g, s);
                    let got = p.deliveries(g, m).iter().filter(|d| d.sender == s).count() as u64;
                    if got != sent {
                        return bad(format!(
                            "subgroup {g}: m{s} sent {sent} messages, m{m} delivered {got} of them (run ended at \
                             {} ns)",
                            h.end_ns
                        ));
                    }
                }
            }
        }
        for m in 0..h.members {
            match p.finished.get(&m) {
                Some(true) => {}
                Some(false) => {
                    return bad(format!("m{m} resumed work after finishing and never finished again"));
                }
                None => return bad(format!("m{m} never finished (run ended at {} ns)", h.end_ns)),
            }
        }
        Ok(())
    }
}

/// Null-sends: off means none; on means bounded, necessary and quiescent
/// (see the module docs).
pub struct NullSends {
    /// The group the history ran.
    pub group: Arc<GroupConfig>,
}

impl Checker<VsyncEvent> for NullSends {
    fn name(&self) -> &'static str {
        "vsync-null-sends"
    }

    fn check(&self, h: &History<VsyncEvent>) -> Result<(), Violation> {
        let p = Parsed::of(h);
        let bad = |m: String| Err(Violation::new(self.name(), m));
        for &(g, m) in p.nulls.keys() {
            if !self.group.switches.null_sends {
                return bad(format!("m{m} sent nulls in subgroup {g} with null-sends off"));
            }
            if rank(&self.group, g, m).is_none() {
                return bad(format!("m{m} sent nulls in subgroup {g}, where it is not a sender"));
            }
        }
        for (g, sub) in self.group.subgroups.iter().enumerate() {
            let n = sub.senders.len() as u64;
            let app: Vec<BTreeSet<u64>> =
                sub.senders.iter().map(|&s| p.rounds_of(g, s).into_iter().collect()).collect();
            let a = app.iter().filter_map(|r| r.last()).map(|r| r + 1).max().unwrap_or(0);
            // The horizon: the last seq a null may answer.
            let last_app = app
                .iter()
                .enumerate()
                .filter_map(|(rank, r)| r.last().map(|k| (k * n + rank as u64) as i64))
                .max();
            let last_declared = sub
                .senders
                .iter()
                .enumerate()
                .filter(|(_, s)| p.declared.get(&(g, **s)).is_some_and(|d| *d > 0))
                .map(|(rank, _)| rank as i64)
                .max();
            let horizon = last_app.max(last_declared);
            for (rank, &s) in sub.senders.iter().enumerate() {
                let declared = p.declared.get(&(g, s)).copied().unwrap_or(0);
                let nulls: u64 = p.nulls.get(&(g, s)).map_or(0, |v| v.iter().map(|x| x.1).sum());
                let total = p.sent_count(g, s) + nulls;
                if total > a + 1 + declared {
                    return bad(format!(
                        "subgroup {g}: m{s} sent {total} rounds ({nulls} null, {declared} declared); the last \
                         application round is {a} - 1: at most {} allowed",
                        a + 1 + declared
                    ));
                }
                if let Some(r) = app[rank].iter().find(|r| **r < declared || **r >= total) {
                    return bad(format!(
                        "subgroup {g}: m{s} delivered an application message in round {r}, outside its \
                         undeclared rounds {declared}..{total}"
                    ));
                }
                if let Some(r) = (declared..total).rev().find(|r| !app[rank].contains(r)) {
                    let seq = (r * n + rank as u64) as i64;
                    if horizon.is_none_or(|h| seq >= h) {
                        return bad(format!(
                            "subgroup {g}: m{s} sent null round {r} (seq {seq}), which precedes no message \
                             sent (last application or declared seq {horizon:?})"
                        ));
                    }
                }
            }
            // Quiescence in time (ordered subgroups).
            if sub.mode != DeliveryMode::Ordered || last_declared > last_app {
                continue;
            }
            let Some(t_quiet) =
                sub.members.iter().filter_map(|&m| p.deliveries(g, m).last()).map(|d| d.time_ns).max()
            else {
                continue;
            };
            for &s in &sub.senders {
                if let Some((t, rounds)) = p.nulls.get(&(g, s)).and_then(|v| v.iter().find(|x| x.0 > t_quiet))
                {
                    return bad(format!(
                        "subgroup {g}: m{s} sent {rounds} null rounds at {t} ns, after every member delivered \
                         the last application message (at {t_quiet} ns)"
                    ));
                }
            }
        }
        Ok(())
    }
}
