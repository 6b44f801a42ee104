//! The r3p2 workload's checkers and its seed reports: pure functions of
//! the recorded history (see the parent module for what each one checks).
#![allow(unused_imports)]

use super::*;

/// Every checker of the workload, in order.
pub fn checkers(params: &Params) -> Vec<Box<dyn Checker<R3Event>>> {
    vec![
        Box::new(ElectionSafety),
        Box::new(LogMatching),
        Box::new(LeaderCompleteness),
        Box::new(StateMachineSafety),
        Box::new(ExactlyOnce),
        Box::new(NoAckedWriteLost),
        Box::new(Linearizable),
        Box::new(Liveness { ops: params.ops }),
    ]
}

/// Runs and checks one seed and describes it (the CLI's report).
pub fn report(seed: u64) -> Result<String, String> {
    seed_report(seed).map(|r| r.summary)
}

/// Runs and checks one seed: its digest and description.
pub(super) fn seed_report(seed: u64) -> Result<SeedReport, String> {
    let params = Params::draw(seed);
    let (h, disks) = std::panic::catch_unwind(|| simulate_counted(seed, &params))
        .map_err(|p| format!("seed {seed}: panicked: {}", panic_message(&*p)))?;
    ordo_sim::check_all(&h, &checkers(&params)).map_err(|v| format!("seed {seed}: {v} ({params:?})"))?;
    let count = |f: &dyn Fn(&R3Event) -> bool| h.entries.iter().filter(|e| f(&e.event)).count();
    let faults = |f: &dyn Fn(&ordo_sim::FaultNote) -> bool| h.faults.iter().filter(|r| f(&r.fault)).count();
    let top = h
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            R3Event::Final { applied, term, .. } => Some((*applied, *term)),
            _ => None,
        })
        .max()
        .unwrap_or_default();
    let summary = format!(
        "{NAME} seed {seed}: passed ({} checkers), history digest {:#018x}\n  \
         {} servers, {} clients x {} ops on {} keys + `log`; tick {} us, snapshot every {}, loss {} ppm, dup {} ppm\n  \
         simulated {:.1} ms (faults until {:.1} ms): {} crashes, {} restarts, {} partitions, {} power losses at fsync, \
         {} torn bytes cut\n  \
         {} elections (final term {}), {} commits observed, {} commands applied ({} distinct), {} snapshot restores\n  \
         {} operations invoked, {} answered; {} retried duplicates answered from the session table (final incarnations)",
        checkers(&params).len(),
        h.digest(),
        params.servers,
        params.clients,
        params.ops,
        params.keys,
        params.tick_ns / 1_000,
        params.snapshot_interval,
        params.net.loss_ppm,
        params.net.duplicate_ppm,
        h.end_ns as f64 / 1e6,
        params.calm_ns as f64 / 1e6,
        faults(&|f| matches!(f, ordo_sim::FaultNote::Crash { .. })),
        faults(&|f| matches!(f, ordo_sim::FaultNote::Restart { .. })),
        faults(&|f| matches!(f, ordo_sim::FaultNote::Cut { .. } | ordo_sim::FaultNote::Split { .. })),
        disks.power_losses,
        disks.torn_bytes,
        count(&|e| matches!(e, R3Event::Leader { .. })),
        top.1,
        count(&|e| matches!(e, R3Event::Commit { .. })),
        count(&|e| matches!(e, R3Event::Applied { .. })),
        top.0,
        count(&|e| matches!(e, R3Event::Restored { .. })),
        count(&|e| matches!(e, R3Event::Invoke { .. })),
        count(&|e| matches!(e, R3Event::Return { .. })),
        h.entries
            .iter()
            .map(|e| match e.event {
                R3Event::Final { duplicates, .. } => duplicates,
                _ => 0,
            })
            .sum::<u64>(),
    );
    Ok(SeedReport { workload: NAME.into(), seed, history_digest: h.digest(), summary })
}

/// Runs and checks one seed; returns the history digest.
pub fn run(seed: u64) -> Result<u64, String> {
    run_with(seed, &Params::draw(seed))
}

/// Runs and checks one seed with `params`.
pub fn run_with(seed: u64, params: &Params) -> Result<u64, String> {
    let history = std::panic::catch_unwind(|| simulate(seed, params))
        .map_err(|p| format!("seed {seed}: panicked: {}", panic_message(&*p)))?;
    ordo_sim::check_all(&history, &checkers(params)).map_err(|v| format!("seed {seed}: {v} ({params:?})"))?;
    Ok(history.digest())
}

/// At most one leader per term, across members and incarnations.
pub struct ElectionSafety;

impl Checker<R3Event> for ElectionSafety {
    fn name(&self) -> &'static str {
        "election-safety"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let mut leaders: BTreeMap<u64, u32> = BTreeMap::new();
        for e in &h.entries {
            if let R3Event::Leader { term, .. } = e.event
                && let Some(other) = leaders.insert(term, e.member)
                && other != e.member
            {
                return Err(Violation::new(
                    self.name(),
                    format!("term {term} has two leaders: m{other} and m{} (at {} ns)", e.member, e.time_ns),
                ));
            }
        }
        Ok(())
    }
}

pub(super) fn finals(h: &History<R3Event>) -> Vec<(u32, &LogView, u64, u64)> {
    h.entries
        .iter()
        .filter_map(|e| match &e.event {
            R3Event::Final { log, applied, commit, .. } => Some((e.member, log, *applied, *commit)),
            _ => None,
        })
        .collect()
}

/// Two final logs that agree on an (index, term) agree on every entry before.
pub struct LogMatching;

impl Checker<R3Event> for LogMatching {
    fn name(&self) -> &'static str {
        "log-matching"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let f = finals(h);
        for (i, (ma, a, ..)) in f.iter().enumerate() {
            for (mb, b, ..) in &f[i + 1..] {
                let lo = a.first.max(b.first);
                let hi = a.last.min(b.last);
                let mut matched: Option<u64> = None;
                for idx in (lo..=hi).rev() {
                    let (ta, tb) = (a.term(idx), b.term(idx));
                    if ta == tb {
                        matched.get_or_insert(idx);
                    } else if let Some(m) = matched {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "m{ma} and m{mb} agree at index {m} but differ at {idx} (terms {ta:?} vs {tb:?})"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A committed entry is in every later leader's log and in every final log
/// that holds it as committed (up to that replica's own commit index: past
/// it, a lagging follower may still hold a stale entry of an older term,
/// as Raft allows, until a leader overwrites it), and every replica that saw
/// index `i` committed saw the same term there.
pub struct LeaderCompleteness;

impl Checker<R3Event> for LeaderCompleteness {
    fn name(&self) -> &'static str {
        "leader-completeness"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        // index → (term, highest current term of a replica that saw it committed)
        let mut committed: BTreeMap<u64, (u64, u64, u32)> = BTreeMap::new();
        for e in &h.entries {
            match &e.event {
                R3Event::Commit { index, term, at_term } if *term != 0 => {
                    let slot = committed.entry(*index).or_insert((*term, *at_term, e.member));
                    if slot.0 != *term {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "index {index} committed with term {} (m{}) and term {term} (m{})",
                                slot.0, slot.2, e.member
                            ),
                        ));
                    }
                    slot.1 = slot.1.min(*at_term);
                }
                R3Event::Leader { term: lt, log } => {
                    for (index, (term, at_term, who)) in &committed {
                        if *lt > *at_term && *index >= log.first && log.term(*index) != Some(*term) {
                            return Err(Violation::new(
                                self.name(),
                                format!(
                                    "m{} became leader of term {lt} at {} ns without index {index} (term \
                                     {term}, committed at term {at_term} per m{who}): its log has {:?}",
                                    e.member,
                                    e.time_ns,
                                    log.term(*index)
                                ),
                            ));
                        }
                    }
                }
                R3Event::Final { log, commit, .. } => {
                    for (index, (term, _, who)) in &committed {
                        if *index >= log.first
                            && *index <= log.last.min(*commit)
                            && log.term(*index) != Some(*term)
                        {
                            return Err(Violation::new(
                                self.name(),
                                format!(
                                    "m{}'s final log has term {:?} at committed index {index} (term {term} per m{who})",
                                    e.member,
                                    log.term(*index)
                                ),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

pub(super) type Cmd = (u64, u32, KvOp);

/// The common apply sequence: position → (command, its reply).
pub(super) fn common_sequence(h: &History<R3Event>) -> Result<BTreeMap<u64, (Cmd, KvReply)>, String> {
    let mut seq: BTreeMap<u64, (Cmd, KvReply, u32)> = BTreeMap::new();
    for e in &h.entries {
        if let R3Event::Applied { position, client, request, op, reply } = &e.event {
            let cmd = (*client, *request, op.clone());
            match seq.get(position) {
                Some((c, r, who)) if (c, r) != (&cmd, reply) => {
                    return Err(format!(
                        "position {position}: m{who} applied {c:?} -> {r:?} but m{} (incarnation {}) applied \
                         {cmd:?} -> {reply:?}",
                        e.member, e.incarnation
                    ));
                }
                Some(_) => {}
                None => {
                    seq.insert(*position, (cmd, reply.clone(), e.member));
                }
            }
        }
    }
    Ok(seq.into_iter().map(|(p, (c, r, _))| (p, (c, r))).collect())
}

/// Every replica applies the same command at the same position (across
/// restarts); the sequence has no hole below any replica's final count; and
/// replaying it yields each live replica's final KV state.
pub struct StateMachineSafety;

impl Checker<R3Event> for StateMachineSafety {
    fn name(&self) -> &'static str {
        "state-machine-safety"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let seq = common_sequence(h).map_err(|m| Violation::new(self.name(), m))?;
        let mut states: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut wanted: Vec<(u32, u64, &Vec<u8>)> = Vec::new();
        for e in &h.entries {
            if let R3Event::Final { applied, state, .. } = &e.event {
                wanted.push((e.member, *applied, state));
                states.insert(*applied, Vec::new());
            }
        }
        let mut kv = KvState::default();
        let top = wanted.iter().map(|w| w.1).max().unwrap_or(0);
        for p in 0..top {
            let Some(((_, _, op), _)) = seq.get(&p) else {
                return Err(Violation::new(
                    self.name(),
                    format!("no replica recorded applying position {p}"),
                ));
            };
            kv.apply(&op.encode());
            if let Some(s) = states.get_mut(&(p + 1)) {
                *s = kv.snapshot();
            }
        }
        if let Some(s) = states.get_mut(&0) {
            *s = KvState::default().snapshot();
        }
        for (m, applied, state) in wanted {
            if states[&applied] != *state {
                return Err(Violation::new(
                    self.name(),
                    format!("m{m}'s final KV state differs from the replay of the first {applied} commands"),
                ));
            }
        }
        Ok(())
    }
}

/// No (client, request) is applied at two positions; an applied command is
/// one a client invoked; a client's answer is the one its command's (first
/// and only) application produced; the append-only key holds each token
/// at most once and every acknowledged token exactly once.
pub struct ExactlyOnce;

impl Checker<R3Event> for ExactlyOnce {
    fn name(&self) -> &'static str {
        "exactly-once"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let v = |m: String| Violation::new("exactly-once", m);
        let seq = common_sequence(h).map_err(v)?;
        let mut at: BTreeMap<(u64, u32), (u64, &KvReply)> = BTreeMap::new();
        for (p, ((c, r, _), reply)) in &seq {
            if let Some((q, _)) = at.insert((*c, *r), (*p, reply)) {
                return Err(v(format!("client {c} request {r} applied twice: at positions {q} and {p}")));
            }
        }
        let mut invoked: BTreeMap<(u64, u32), &KvOp> = BTreeMap::new();
        let mut acked: Vec<&KvOp> = Vec::new();
        for e in &h.entries {
            match &e.event {
                R3Event::Invoke { client, request, op } => {
                    invoked.insert((*client, *request), op);
                }
                R3Event::Return { client, request, reply } => {
                    if let Some((p, applied)) = at.get(&(*client, *request))
                        && *applied != reply
                    {
                        return Err(v(format!(
                            "client {client} request {request} got {reply:?} but its application at position \
                             {p} answered {applied:?}"
                        )));
                    }
                    acked.push(invoked[&(*client, *request)]);
                }
                _ => {}
            }
        }
        for ((c, r, op), _) in seq.values() {
            if invoked.get(&(*c, *r)) != Some(&op) {
                return Err(v(format!("applied {op:?} as client {c} request {r}, which it did not invoke")));
            }
        }
        // The append-only key in each live replica's final state.
        for e in &h.entries {
            let R3Event::Final { state, applied, .. } = &e.event else { continue };
            let kv = KvState::from_snapshot(state).map_err(|m| v(m.to_string()))?;
            let value = kv.get(LOG_KEY).unwrap_or(&[]);
            let mut tokens: BTreeMap<&[u8], u32> = BTreeMap::new();
            for t in value.split(|b| *b == b';').filter(|t| !t.is_empty()) {
                *tokens.entry(t).or_default() += 1;
            }
            for (t, n) in &tokens {
                if *n > 1 {
                    return Err(v(format!(
                        "m{}: token {} appended {n} times",
                        e.member,
                        String::from_utf8_lossy(t)
                    )));
                }
            }
            for op in &acked {
                if let KvOp::Append { key, value } = op
                    && key == LOG_KEY
                {
                    let t = &value[..value.len() - 1];
                    let pos = seq.iter().find(|(_, ((_, _, o), _))| o == *op).map(|(p, _)| *p);
                    if pos.is_some_and(|p| p < *applied) && !tokens.contains_key(t) {
                        return Err(v(format!(
                            "m{}: acknowledged append {} is missing",
                            e.member,
                            String::from_utf8_lossy(t)
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Every operation a client saw answered was applied (in the common
/// sequence, below the most advanced live replica's count).
pub struct NoAckedWriteLost;

impl Checker<R3Event> for NoAckedWriteLost {
    fn name(&self) -> &'static str {
        "no-acked-write-lost"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let seq = common_sequence(h).map_err(|m| Violation::new(self.name(), m))?;
        let top = finals(h).iter().map(|f| f.2).max();
        let Some(top) = top else { return Ok(()) };
        let at: BTreeMap<(u64, u32), u64> = seq.iter().map(|(p, ((c, r, _), _))| ((*c, *r), *p)).collect();
        for e in &h.entries {
            if let R3Event::Return { client, request, .. } = e.event {
                match at.get(&(client, request)) {
                    Some(p) if *p < top => {}
                    other => {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "client {client} request {request} was answered at {} ns but is at position \
                                 {other:?} of the applied sequence (the live replicas applied {top})",
                                e.time_ns
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One key of the KV store as a sequential specification.
#[derive(Clone, Debug, Default)]
pub struct KvSpec(KvState);

impl SequentialSpec for KvSpec {
    type Op = KvOp;
    type Ret = KvReply;
    fn invoke(&mut self, op: &KvOp) -> KvReply {
        self.0.apply(&op.encode())
    }
}

/// Linearizability of the KV service, key by key (compositional), with
/// stateright's tester; operations still in flight at the end may or may
/// not have taken effect.
pub struct Linearizable;

impl Checker<R3Event> for Linearizable {
    fn name(&self) -> &'static str {
        "linearizability"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let mut testers: BTreeMap<Vec<u8>, LinearizabilityTester<u64, KvSpec>> = BTreeMap::new();
        let mut key_of: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for e in &h.entries {
            match &e.event {
                R3Event::Invoke { client, op, .. } => {
                    let key = op.key().to_vec();
                    key_of.insert(*client, key.clone());
                    let t =
                        testers.entry(key).or_insert_with(|| LinearizabilityTester::new(KvSpec::default()));
                    t.on_invoke(*client, op.clone()).map_err(|m| Violation::new(self.name(), m))?;
                }
                R3Event::Return { client, reply, .. } => {
                    let key = &key_of[client];
                    let t = testers.get_mut(key).expect("invoked");
                    t.on_return(*client, reply.clone()).map_err(|m| Violation::new(self.name(), m))?;
                }
                _ => {}
            }
        }
        for (key, t) in &testers {
            if !t.is_consistent() {
                return Err(Violation::new(
                    self.name(),
                    format!("the history of key {} is not linearizable", String::from_utf8_lossy(key)),
                ));
            }
        }
        Ok(())
    }
}

/// After the faults healed: a live leader at the end, and every operation
/// answered.
pub struct Liveness {
    /// Operations each client must have had answered.
    pub ops: u32,
}

impl Checker<R3Event> for Liveness {
    fn name(&self) -> &'static str {
        "liveness"
    }
    fn check(&self, h: &History<R3Event>) -> Result<(), Violation> {
        let calm = h.faults.iter().find(|f| f.fault == ordo_sim::FaultNote::Calm).map_or(0, |f| f.time_ns);
        let mut open: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        let mut answered: BTreeMap<u64, u32> = BTreeMap::new();
        let mut after_calm: BTreeMap<u64, u32> = BTreeMap::new();
        for e in &h.entries {
            match &e.event {
                R3Event::Invoke { client, request, .. } => {
                    open.insert(*client, (*request, e.time_ns));
                }
                R3Event::Return { client, .. } => {
                    let (_, invoked) = open.remove(client).unwrap_or_default();
                    *answered.entry(*client).or_default() += 1;
                    if invoked >= calm {
                        *after_calm.entry(*client).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        if let Some((c, (r, t))) = open.iter().next() {
            return Err(Violation::new(
                self.name(),
                format!("client {c} request {r} (invoked at {t} ns) never answered by {} ns", h.end_ns),
            ));
        }
        if let Some((c, n)) =
            answered.iter().find(|(c, _)| after_calm.get(*c).copied().unwrap_or(0) < AFTER_CALM)
        {
            return Err(Violation::new(
                self.name(),
                format!(
                    "client {c} ({n} answered) had fewer than {AFTER_CALM} operations invoked after the heal at {calm} ns answered"
                ),
            ));
        }
        if let Some((c, n)) = answered.iter().find(|(_, n)| **n < self.ops) {
            return Err(Violation::new(
                self.name(),
                format!("client {c} had only {n} of {} operations answered", self.ops),
            ));
        }
        // A leader after the heal: one at the end, or one elected after it.
        let leader = h.entries.iter().any(|e| match e.event {
            R3Event::Final { leader, .. } => leader,
            R3Event::Leader { .. } => e.time_ns >= calm,
            _ => false,
        });
        if !leader {
            return Err(Violation::new(self.name(), "no leader after the heal"));
        }
        Ok(())
    }
}
