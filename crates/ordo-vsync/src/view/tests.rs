use super::*;
use crate::config::{DeliveryMode, Switches};
use std::collections::VecDeque;

fn template(n: u32) -> GroupConfig {
    GroupConfig {
        members: (0..n).collect(),
        subgroups: vec![SubgroupConfig {
            name: String::new(),
            descriptor: Vec::new(),
            members: (0..n).collect(),
            senders: (0..n).collect(),
            window: 4,
            max_payload: 16,
            mode: DeliveryMode::Ordered,
        }],
        switches: Switches::SPINDLE,
    }
}

/// Whether the network drops a message (from, to, message).
type DropRule = Box<dyn FnMut(MemberId, MemberId, &ControlMsg) -> bool>;

/// A group of view-change state machines on a FIFO network that can drop
/// everything to and from dead members, or only some messages.
struct Net {
    vcs: Vec<ViewChange>,
    /// Frozen received counts per member (one subgroup, one count per sender).
    received: Vec<Vec<Vec<u64>>>,
    dead: BTreeSet<MemberId>,
    queue: VecDeque<(MemberId, MemberId, ControlMsg)>,
    events: Vec<Vec<ViewEvent>>,
    /// Messages `(from, to)` are dropped while this says so.
    drop: DropRule,
}

impl Net {
    fn new(n: u32, received: Vec<Vec<u64>>) -> Net {
        let t = template(n);
        let view = View { id: 0, members: (0..n).collect() };
        Net {
            vcs: (0..n).map(|m| ViewChange::new(m, t.clone(), view.clone()).unwrap()).collect(),
            received: received.into_iter().map(|r| vec![r]).collect(),
            dead: BTreeSet::new(),
            queue: VecDeque::new(),
            events: vec![Vec::new(); n as usize],
            drop: Box::new(|_, _, _| false),
        }
    }

    fn collect(&mut self, m: MemberId) {
        let out = self.vcs[m as usize].take_outbox();
        for (to, msg) in out {
            // Every message goes through the wire format.
            let msg = ControlMsg::decode(&msg.to_bytes()).expect("round trip");
            self.queue.push_back((m, to, msg));
        }
        let ev = self.vcs[m as usize].take_events();
        for e in &ev {
            if let ViewEvent::Install { decision, .. } = e {
                // A new view: the engine starts from zero counts.
                let subs = self.vcs[m as usize].group().config.subgroups.len();
                let g = &self.vcs[m as usize].group().config;
                self.received[m as usize] = (0..subs)
                    .map(|s| {
                        if g.subgroups[s].members.contains(&m) {
                            vec![0; g.subgroups[s].senders.len()]
                        } else {
                            vec![]
                        }
                    })
                    .collect();
                let _ = decision;
            }
        }
        let installed = ev.iter().any(|e| matches!(e, ViewEvent::Install { .. }));
        self.events[m as usize].extend(ev);
        if installed {
            self.vcs[m as usize].installed();
            self.collect(m);
        }
    }

    fn suspect(&mut self, m: MemberId, peer: MemberId) {
        let r = self.received[m as usize].clone();
        self.vcs[m as usize].suspect(peer, &r);
        self.collect(m);
    }

    fn tick_all(&mut self) {
        for m in 0..self.vcs.len() as MemberId {
            if !self.dead.contains(&m) {
                let r = self.received[m as usize].clone();
                self.vcs[m as usize].tick(&r);
                self.collect(m);
            }
        }
    }

    /// Delivers queued messages until none is left (at most `limit`).
    fn run(&mut self, limit: usize) {
        for _ in 0..limit {
            let Some((from, to, msg)) = self.queue.pop_front() else { return };
            if self.dead.contains(&from) || self.dead.contains(&to) || (self.drop)(from, to, &msg) {
                continue;
            }
            let r = self.received[to as usize].clone();
            self.vcs[to as usize].on_message(from, msg, &r);
            self.collect(to);
        }
        panic!("the network did not quiesce");
    }

    /// Runs and ticks until quiet for a while.
    fn settle(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.run(100_000);
            self.tick_all();
        }
        self.run(100_000);
    }

    fn installs(&self, m: MemberId) -> Vec<Decision> {
        self.events[m as usize]
            .iter()
            .filter_map(|e| match e {
                ViewEvent::Install { decision, .. } => Some(decision.clone()),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn every_message_round_trips_and_every_truncation_is_refused() {
    let d = Decision {
        next: View { id: 4, members: vec![0, 2, 5] },
        trims: vec![vec![3, 1, 0], vec![]],
        incarnations: vec![0, 0, 77],
        subgroups: vec![
            template(6).subgroups[0].clone(),
            SubgroupConfig {
                members: vec![2, 5],
                senders: vec![],
                window: 8,
                max_payload: 1024,
                mode: DeliveryMode::Unordered,
                name: "topic/é".into(),
                descriptor: b"{\"qos\":1}".to_vec(),
            },
        ],
    };
    let decl = Declaration {
        name: "t".into(),
        descriptor: vec![1, 2, 3],
        window: 3,
        max_payload: 99,
        mode: DeliveryMode::Ordered,
        sender: true,
    };
    let b = Ballot { round: 7, leader: 2 };
    let msgs = vec![
        ControlMsg::Suspect { view: 3, suspects: vec![1, 4] },
        ControlMsg::Prepare { view: 3, ballot: b },
        ControlMsg::Promise {
            view: 3,
            ballot: b,
            accepted: None,
            received: vec![vec![5, 6]],
            suspects: vec![],
        },
        ControlMsg::Promise {
            view: 3,
            ballot: b,
            accepted: Some((Ballot { round: 2, leader: 0 }, d.clone())),
            received: vec![vec![], vec![1]],
            suspects: vec![9],
        },
        ControlMsg::Nack { view: 3, promised: b },
        ControlMsg::Accept { view: 3, ballot: b, decision: d.clone() },
        ControlMsg::Accepted { view: 3, ballot: b },
        ControlMsg::Commit { view: 3, decision: d },
        ControlMsg::Installed { view: 3 },
        ControlMsg::Heartbeat { view: 3 },
        ControlMsg::Join { view: 0, incarnation: 12345 },
        ControlMsg::State { view: 4, subgroup: 1, offset: 3, total: 10, bytes: vec![1, 2, 3] },
        ControlMsg::StateRequest { view: 4, subgroup: 1, offset: 3 },
        ControlMsg::NoState { view: 4, subgroup: 1 },
        ControlMsg::Declare { view: 2, declaration: decl.clone() },
        ControlMsg::Declare {
            view: 2,
            declaration: Declaration { sender: false, descriptor: vec![], ..decl },
        },
    ];
    for m in msgs {
        let bytes = m.to_bytes();
        assert_eq!(ControlMsg::decode(&bytes), Ok(m.clone()));
        for cut in 0..bytes.len() {
            assert!(ControlMsg::decode(&bytes[..cut]).is_err(), "{m:?} cut at {cut} decoded");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(ControlMsg::decode(&longer), Err(DecodeError::Trailing(1)));
    }
}

#[test]
fn malformed_frames_are_refused_before_allocating() {
    assert_eq!(ControlMsg::decode(&[]), Err(DecodeError::Truncated));
    let mut unknown = vec![42];
    unknown.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(ControlMsg::decode(&unknown), Err(DecodeError::UnknownTag(42)));
    // A suspect list claiming 2^32-1 members in 4 bytes.
    let mut huge = vec![TAG_SUSPECT];
    huge.extend_from_slice(&0u64.to_le_bytes());
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(ControlMsg::decode(&huge), Err(DecodeError::TooLong { .. })));
    // Within the bound but longer than the bytes left.
    let mut lying = vec![TAG_SUSPECT];
    lying.extend_from_slice(&0u64.to_le_bytes());
    lying.extend_from_slice(&1000u32.to_le_bytes());
    assert_eq!(ControlMsg::decode(&lying), Err(DecodeError::Truncated));
    let dup = ControlMsg::Suspect { view: 0, suspects: vec![3, 3] }.to_bytes();
    assert!(matches!(ControlMsg::decode(&dup), Err(DecodeError::Invalid(_))));
    let empty_view = ControlMsg::Commit {
        view: 0,
        decision: Decision {
            next: View { id: 1, members: vec![] },
            trims: vec![],
            incarnations: vec![],
            subgroups: vec![],
        },
    };
    assert!(matches!(ControlMsg::decode(&empty_view.to_bytes()), Err(DecodeError::Invalid(_))));
    // A catalogue whose subgroup names a sender that is no member, or
    // lists a name twice; a declaration with an empty name.
    let mut sub = template(3).subgroups[0].clone();
    sub.name = "a".into();
    let bad = |subgroups: Vec<SubgroupConfig>| ControlMsg::Commit {
        view: 0,
        decision: Decision {
            next: View { id: 1, members: vec![0] },
            trims: vec![],
            incarnations: vec![0],
            subgroups,
        },
    };
    let stranger = SubgroupConfig { senders: vec![7], ..sub.clone() };
    assert!(matches!(ControlMsg::decode(&bad(vec![stranger]).to_bytes()), Err(DecodeError::Invalid(_))));
    assert!(matches!(
        ControlMsg::decode(&bad(vec![sub.clone(), sub.clone()]).to_bytes()),
        Err(DecodeError::Invalid(_))
    ));
    let unnamed = ControlMsg::Declare {
        view: 0,
        declaration: Declaration {
            name: String::new(),
            descriptor: vec![],
            window: 1,
            max_payload: 1,
            mode: DeliveryMode::Ordered,
            sender: false,
        },
    };
    assert!(matches!(ControlMsg::decode(&unnamed.to_bytes()), Err(DecodeError::Invalid(_))));
}

#[test]
fn a_crashed_member_is_removed_and_the_trim_is_the_survivors_minimum() {
    // Rounds received from senders 0, 1, 2 at members 0, 1, 2.
    let mut net = Net::new(3, vec![vec![5, 3, 9], vec![4, 6, 9], vec![9, 9, 9]]);
    net.dead.insert(2);
    net.suspect(0, 2);
    net.suspect(1, 2);
    net.settle(3);
    for m in [0, 1] {
        let d = net.installs(m);
        assert_eq!(d.len(), 1, "m{m} installs one view");
        assert_eq!(d[0].next, View { id: 1, members: vec![0, 1] });
        assert_eq!(d[0].trims, vec![vec![4, 3, 9]], "per sender, the minimum over the survivors");
    }
}

#[test]
fn a_dead_leader_is_replaced() {
    let mut net = Net::new(3, vec![vec![1, 1, 1]; 3]);
    net.dead.insert(0);
    net.suspect(1, 0);
    net.settle(3);
    for m in [1, 2] {
        assert_eq!(net.installs(m)[0].next, View { id: 1, members: vec![1, 2] }, "m{m}");
    }
}

#[test]
fn a_decision_accepted_before_the_leader_died_is_adopted_by_the_next_leader() {
    // Member 4 is suspected; leader 0 gets every promise, sends Accept to 1
    // only, and dies before committing.
    let mut net = Net::new(5, vec![vec![2; 5]; 5]);
    net.dead.insert(4);
    net.drop = Box::new(|from, to, msg| from == 0 && to >= 2 && matches!(msg, ControlMsg::Accept { .. }));
    for m in 0..4 {
        net.suspect(m, 4);
    }
    net.run(10_000);
    let accepted = net.vcs[1].accepted.clone().expect("member 1 accepted the leader's decision");
    assert_eq!(accepted.1.next.members, vec![0, 1, 2, 3]);
    assert!(net.installs(1).is_empty(), "nothing committed yet");
    net.dead.insert(0);
    net.drop = Box::new(|_, _, _| false);
    for m in 1..4 {
        net.suspect(m, 0);
    }
    // Member 1 yields to the dead leader's last ballot for two patiences.
    net.settle(4 + 3 * DEFAULT_PATIENCE as usize);
    for m in 1..4 {
        let d = net.installs(m);
        assert_eq!(d[0], accepted.1, "m{m} installs the decision member 1 accepted, dead leader included");
    }
    // In that view the dead leader is suspected again and removed.
    for m in 1..4 {
        net.suspect(m, 0);
    }
    net.settle(4);
    for m in 1..4 {
        assert_eq!(net.installs(m)[1].next, View { id: 2, members: vec![1, 2, 3] });
    }
}

#[test]
fn a_member_that_suspects_a_majority_stops_in_a_minority_and_installs_nothing() {
    let mut net = Net::new(5, vec![vec![0; 5]; 5]);
    for p in [2, 3, 4] {
        net.suspect(0, p);
    }
    assert_eq!(net.vcs[0].status(), Status::Running, "it waits a patience for a decision first");
    for _ in 0..DEFAULT_PATIENCE {
        let r = net.received[0].clone();
        net.vcs[0].tick(&r);
        net.collect(0);
    }
    assert!(net.events[0].iter().any(|e| matches!(e, ViewEvent::Minority { .. })));
    assert_eq!(net.vcs[0].status(), Status::Minority);
    net.settle(2);
    assert!(net.installs(0).is_empty());
}

#[test]
fn the_majority_side_of_a_split_goes_on_and_the_minority_stops() {
    let mut net = Net::new(5, vec![vec![3; 5]; 5]);
    let side = |m: MemberId| m < 2;
    net.drop = Box::new(move |a, b, _| side(a) != side(b));
    for a in 0..5 {
        for b in 0..5 {
            if a != b && side(a) != side(b) {
                net.suspect(a, b);
            }
        }
    }
    net.settle(4);
    for m in [0, 1] {
        assert_eq!(net.vcs[m as usize].status(), Status::Minority, "m{m}");
        assert!(net.installs(m).is_empty());
    }
    for m in [2, 3, 4] {
        assert_eq!(net.installs(m)[0].next, View { id: 1, members: vec![2, 3, 4] }, "m{m}");
    }
}

#[test]
fn a_suspected_member_that_is_alive_learns_it_was_removed() {
    let mut net = Net::new(3, vec![vec![0; 3]; 3]);
    // Member 1 suspects 2 falsely; 0 and 1 decide without 2; 2 learns it.
    net.drop = Box::new(|_, to, msg| to == 2 && matches!(msg, ControlMsg::Prepare { .. }));
    net.suspect(0, 2);
    net.settle(3);
    assert_eq!(net.installs(0)[0].next.members, vec![0, 1]);
    assert!(
        net.events[2]
            .iter()
            .any(|e| matches!(e, ViewEvent::Removed { next, .. } if next.members == vec![0, 1])),
        "{:?}",
        net.events[2]
    );
    assert_eq!(net.vcs[2].status(), Status::Removed);
}

#[test]
fn a_silent_member_is_suspected_after_missed_heartbeats() {
    let mut net = Net::new(3, vec![vec![0; 3]; 3]);
    net.dead.insert(2);
    let limit = DEFAULT_PATIENCE * SILENCE_PATIENCES;
    // Never heard from in this view: four times the limit.
    for _ in 0..4 * limit {
        net.tick_all();
        net.run(10_000);
    }
    assert!(net.installs(0).is_empty(), "no suspicion before the limit");
    net.settle(6);
    assert_eq!(net.installs(0)[0].next.members, vec![0, 1]);
}

#[test]
fn a_straggler_gets_the_commit_of_its_view() {
    let mut net = Net::new(3, vec![vec![0; 3]; 3]);
    net.dead.insert(2);
    net.suspect(0, 2);
    net.settle(3);
    // A stale prepare of view 0 reaches member 1, now in view 1.
    let r = net.received[1].clone();
    net.vcs[1].on_message(0, ControlMsg::Prepare { view: 0, ballot: Ballot { round: 9, leader: 0 } }, &r);
    let out = net.vcs[1].take_outbox();
    assert!(out.iter().any(|(to, m)| *to == 0 && matches!(m, ControlMsg::Commit { view: 0, .. })), "{out:?}");
}

#[test]
fn a_graceful_leave_removes_the_member() {
    let mut net = Net::new(3, vec![vec![0; 3]; 3]);
    let r = net.received[1].clone();
    net.vcs[1].leave(&r);
    net.collect(1);
    net.settle(3);
    assert_eq!(net.installs(0)[0].next.members, vec![0, 2]);
    assert_eq!(net.vcs[1].status(), Status::Removed);
}

#[test]
fn allocation_keeps_configured_indices_and_drops_subgroups_without_senders() {
    let mut t = template(4);
    t.subgroups.push(SubgroupConfig {
        name: String::new(),
        descriptor: Vec::new(),
        members: vec![1, 2, 3],
        senders: vec![3],
        window: 2,
        max_payload: 8,
        mode: DeliveryMode::Unordered,
    });
    let g = allocate(&t, &View { id: 5, members: vec![0, 1, 2] });
    assert_eq!(g.index, vec![Some(0), None], "subgroup 1 lost its only sender");
    assert_eq!(g.configured, vec![0]);
    assert_eq!(g.config.subgroups[0].senders, vec![0, 1, 2]);
    assert_eq!(g.config.members, vec![0, 1, 2]);
}

fn decl(name: &str, sender: bool) -> Declaration {
    Declaration {
        name: name.into(),
        descriptor: b"desc".to_vec(),
        window: 4,
        max_payload: 64,
        mode: DeliveryMode::Ordered,
        sender,
    }
}

impl Net {
    fn declare(&mut self, m: MemberId, d: Declaration) {
        let r = self.received[m as usize].clone();
        self.vcs[m as usize].declare(d, &r);
        self.collect(m);
    }

    fn declared(&self, m: MemberId) -> Vec<(String, Result<usize, String>)> {
        self.events[m as usize]
            .iter()
            .filter_map(|e| match e {
                ViewEvent::Answered(a) => Some((a.name.clone(), a.outcome.clone())),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_declared_subgroup_is_created_by_a_view_change_and_every_member_installs_one_catalogue() {
    let mut net = Net::new(3, vec![vec![0, 0, 0]; 3]);
    net.declare(2, decl("prices", true));
    net.settle(3);
    for m in 0..3 {
        let installs = net.installs(m);
        assert_eq!(installs.len(), 1, "one view change for one declaration");
        assert_eq!(installs[0].next.members, vec![0, 1, 2], "nobody leaves");
        let t = net.vcs[m as usize].template();
        assert_eq!(t.subgroups.len(), 2);
        assert_eq!(t.subgroups[1].name, "prices");
        assert_eq!((t.subgroups[1].members.clone(), t.subgroups[1].senders.clone()), (vec![2], vec![2]));
        // The view runs it: an active subgroup of one member.
        assert_eq!(net.vcs[m as usize].group().index, vec![Some(0), Some(1)]);
    }
    assert_eq!(net.declared(2), vec![("prices".to_string(), Ok(1))]);
    // A subscriber joins it: appended, not a sender; a second declaration
    // of the same shape by the same member is answered at once.
    net.declare(0, decl("prices", false));
    net.settle(3);
    for m in 0..3 {
        let s = &net.vcs[m as usize].template().subgroups[1];
        assert_eq!((s.members.clone(), s.senders.clone()), (vec![2, 0], vec![2]));
        assert_eq!(net.installs(m).len(), 2);
    }
    net.declare(0, decl("prices", false));
    assert_eq!(net.declared(0), vec![("prices".to_string(), Ok(1)), ("prices".to_string(), Ok(1))]);
    assert_eq!(net.installs(0).len(), 2, "no view change for a declaration already in");
}

#[test]
fn a_declaration_of_another_shape_is_refused_and_changes_nothing() {
    let mut net = Net::new(3, vec![vec![0, 0, 0]; 3]);
    net.declare(1, decl("t", true));
    net.settle(3);
    let before = net.vcs[0].template().clone();
    let mut other = decl("t", false);
    other.window = 8;
    net.declare(0, other.clone());
    net.settle(3);
    assert!(matches!(&net.declared(0)[..], [(n, Err(why))] if n == "t" && why.contains("another shape")));
    assert_eq!(net.installs(0).len(), 1, "a refused declaration starts no view change");
    assert_eq!(net.vcs[0].template(), &before);
    // Two members racing to create one name with different shapes: the
    // decision applies one (by declarer order), the other is refused.
    let mut net = Net::new(3, vec![vec![0, 0, 0]; 3]);
    net.declare(1, decl("x", true));
    net.declare(2, other.clone().tap_name("x"));
    net.settle(4);
    let t = net.vcs[0].template().clone();
    for m in 0..3 {
        assert_eq!(net.vcs[m as usize].template(), &t, "one catalogue");
    }
    let x = t.subgroups.iter().find(|s| s.name == "x").unwrap();
    assert_eq!(x.members, vec![1]);
    assert!(matches!(&net.declared(1)[..], [(_, Ok(_))]));
    assert!(matches!(&net.declared(2)[..], [(_, Err(_))]));
}

#[test]
fn a_declaration_lost_with_a_dead_leader_is_resent_until_it_is_in() {
    let mut net = Net::new(4, vec![vec![0, 0, 0, 0]; 4]);
    // Member 3's declarations never reach the leader (0), which dies.
    net.drop = Box::new(|from, to, msg| from == 3 && to == 0 && matches!(msg, ControlMsg::Declare { .. }));
    net.declare(3, decl("late", false));
    net.run(100_000);
    net.dead.insert(0);
    for m in 1..4 {
        net.suspect(m, 0);
    }
    net.settle(20);
    for m in 1..4 {
        let t = net.vcs[m as usize].template();
        let late = t.subgroups.iter().find(|s| s.name == "late").expect("created in a later view");
        assert_eq!(late.members, vec![3]);
        assert!(late.senders.is_empty(), "a subscriber only: inactive until a sender joins");
        assert_eq!(
            net.vcs[m as usize].group().config.subgroups.len(),
            1,
            "no sender: not in the view's engine"
        );
    }
    assert!(matches!(&net.declared(3)[..], [(_, Ok(1))]));
}

#[test]
fn the_catalogue_is_bounded() {
    let mut t = template(2);
    let mut made = 0;
    for i in 0..10_000 {
        let mut d = decl(&format!("topic-{i:04}"), true);
        d.descriptor = vec![7; 200];
        if !apply_declaration(&mut t, 1, &d) {
            break;
        }
        made += 1;
    }
    assert!(made > 10 && made < 10_000);
    assert!(catalogue_len(&t.subgroups) <= MAX_CATALOGUE_BYTES);
    assert!(extends(&template(2).subgroups, &t.subgroups));
    assert!(!extends(&t.subgroups, &template(2).subgroups));
}

trait TapName {
    fn tap_name(self, name: &str) -> Self;
}

impl TapName for Declaration {
    fn tap_name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }
}

#[test]
fn a_second_declaration_of_a_pending_name_joins_it() {
    let mut net = Net::new(3, vec![vec![0, 0, 0]; 3]);
    // A reader, then (before any view change) a writer of one topic: one
    // pending declaration, a sender, one answer.
    net.declare(1, decl("both", false));
    net.declare(1, decl("both", true));
    let mut other = decl("both", false);
    other.max_payload = 65;
    net.declare(1, other);
    net.settle(3);
    let s = &net.vcs[0].template().subgroups[1];
    assert_eq!((s.members.clone(), s.senders.clone()), (vec![1], vec![1]));
    assert_eq!(net.installs(1).len(), 1);
    let answers = net.declared(1);
    assert!(
        matches!(&answers[..], [(_, Err(why)), (_, Ok(1))] if why.contains("another shape")),
        "{answers:?}"
    );
}
