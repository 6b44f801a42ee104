//! The Acuerdo scenario driver: one `ordo_acuerdo::AcuerdoDriver` (the type
//! the runtime's agent wraps) per member over a [`ScriptFabric`], whose
//! writes wait in per-link FIFO queues until the script lets them land — so
//! each step of a story (acuerdo Fig. 3) happens exactly as told.
//!
//! Commands (times `t` in microseconds):
//! - `cluster members=(1,2,3) [heartbeat-timeout-us=1000] [election-timeout-us=10000] [log-gc=false]`
//! - `poll ID t=T` — one poll of member ID at time T; prints its notes and
//!   the commits of its own messages
//! - `deliver [from=S to=(D,...)]` — lets the writes queued on those links
//!   (or on all) land
//! - `settle t=T [rounds=4]` — every live member polls, then everything
//!   lands, `rounds` times (prints the notes)
//! - `run until=T [step=50]` — from the latest time polled, every member
//!   polls and everything lands every `step` µs until T (prints the notes)
//! - `broadcast ID data=X` — a client request at member ID: the header or
//!   the refusal
//! - `crash ID`, `restart ID t=T` (a new incarnation with a zeroed region),
//!   `partition` (input: groups), `heal`
//! - `accept-seen at=A of=B` — the Accept entry of B in A's SST
//! - `status` — role, epoch, Accepted, Committed and delivered payloads

use super::{Args, ScriptFabric, ScriptNet, arg, args_list, groups, member_arg, status_lines};
use ordo_acuerdo::{AcuerdoDriver, Config, DeliverySink, Header, Layout, Note, Role, Settled};
use ordo_fabric::MemberId;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;

const US: u64 = 1_000;

/// The application of a scripted member: what it delivered.
#[derive(Default)]
struct App {
    delivered: Vec<(Header, Vec<u8>)>,
}

impl DeliverySink for App {
    fn deliver(&mut self, header: Header, payload: &[u8]) {
        self.delivered.push((header, payload.to_vec()));
    }
}

struct Member {
    driver: Option<AcuerdoDriver<ScriptFabric>>,
    app: App,
    incarnation: u64,
    next_ticket: u64,
}

/// A scripted Acuerdo group.
#[derive(Default)]
pub struct AcuerdoCluster {
    net: Option<Rc<RefCell<ScriptNet>>>,
    members: BTreeMap<MemberId, Member>,
    ids: Vec<MemberId>,
    heartbeat_timeout_ns: u64,
    election_timeout_ns: u64,
    log_gc: bool,
    /// `Config::epoch_messages` (0: the engine's default).
    epoch_messages: u32,
    region_len: usize,
    /// The latest time any command polled at, in microseconds.
    now_us: u64,
}

impl AcuerdoCluster {
    /// Runs one script command; returns what it prints.
    pub fn handle(&mut self, directive: &str, args: &Args, input: &str) -> Result<String, String> {
        match directive {
            "cluster" => self.cluster(args),
            "poll" => {
                let id = member_arg(args, "poll")? as MemberId;
                let t: u64 = arg(args, "t", 0)?;
                Ok(self.poll(id, t * US))
            }
            "deliver" => self.net()?.borrow_mut().deliver_command(args),
            "settle" => {
                let t: u64 = arg(args, "t", 0)?;
                let rounds: usize = arg(args, "rounds", 4)?;
                let mut out = String::new();
                for _ in 0..rounds {
                    for id in self.ids.clone() {
                        out += &self.poll(id, t * US);
                    }
                    self.net()?.borrow_mut().deliver_all();
                }
                Ok(out)
            }
            "run" => {
                let until: u64 = arg(args, "until", 0)?;
                let step: u64 = arg(args, "step", 50)?.max(1);
                let mut out = String::new();
                let mut t = self.now_us;
                while t < until {
                    t = (t + step).min(until);
                    for id in self.ids.clone() {
                        out += &self.poll(id, t * US);
                    }
                    self.net()?.borrow_mut().deliver_all();
                }
                Ok(out)
            }
            "broadcast" => {
                let id = member_arg(args, "broadcast")? as MemberId;
                let data: String = arg(args, "data", String::new())?;
                let member = self.members.get_mut(&id).ok_or("no such member")?;
                let driver = member.driver.as_mut().ok_or("member is down")?;
                member.next_ticket += 1;
                Ok(match driver.submit(member.next_ticket, data.as_bytes()) {
                    Ok(h) => format!("{h:?}\n"),
                    Err(e) => format!("refused: {e}\n"),
                })
            }
            "crash" => {
                let id = member_arg(args, "crash")? as MemberId;
                self.net()?.borrow_mut().crash(id);
                self.members.get_mut(&id).ok_or("no such member")?.driver = None;
                Ok(String::new())
            }
            "restart" => {
                let id = member_arg(args, "restart")? as MemberId;
                let t: u64 = arg(args, "t", 0)?;
                let net = self.net()?;
                let incarnation = net.borrow_mut().restart(id, self.region_len);
                let driver = self.start(&net, id, incarnation, t * US)?;
                let member = self.members.get_mut(&id).ok_or("no such member")?;
                member.driver = Some(driver);
                member.incarnation = incarnation;
                member.app = App::default();
                Ok(format!("{id}: incarnation {incarnation}\n"))
            }
            "partition" => {
                self.net()?.borrow_mut().partition(&groups(input)?);
                Ok(String::new())
            }
            "heal" => {
                self.net()?.borrow_mut().heal();
                Ok(String::new())
            }
            "accept-seen" => {
                let at: MemberId = arg(args, "at", 0)?;
                let of: MemberId = arg(args, "of", 0)?;
                let driver = self.members.get(&at).and_then(|m| m.driver.as_ref()).ok_or("member is down")?;
                let layout = driver.engine().layout().clone();
                let row = self.ids.iter().position(|m| *m == of).ok_or("no such member")?;
                let word = ordo_fabric::Fabric::region(driver.fabric()).load_acquire(layout.word(
                    row,
                    layout.columns.accept,
                    0,
                ));
                Ok(format!("{:?}\n", Header::decode(word)))
            }
            "queues" => Ok(self.net()?.borrow().describe_queues()),
            "status" => Ok(self.status()),
            other => Err(format!("unknown command {other}")),
        }
    }

    fn net(&self) -> Result<Rc<RefCell<ScriptNet>>, String> {
        self.net.clone().ok_or_else(|| "no cluster yet".to_string())
    }

    fn config(&self, me: MemberId, incarnation: u64) -> Config {
        let mut cfg = Config::new(self.ids.clone(), me);
        cfg.incarnation = incarnation;
        cfg.heartbeat_interval_ns = 50 * US;
        cfg.heartbeat_timeout_ns = self.heartbeat_timeout_ns;
        cfg.election_timeout_ns = self.election_timeout_ns;
        // The script runs at fixed instants: Commit columns go out at once
        // rather than periodically.
        cfg.commit_push_interval_ns = 0;
        cfg.log_gc = self.log_gc;
        if self.epoch_messages > 0 {
            cfg.epoch_messages = self.epoch_messages;
        }
        cfg
    }

    fn start(
        &self,
        net: &Rc<RefCell<ScriptNet>>,
        id: MemberId,
        incarnation: u64,
        now_ns: u64,
    ) -> Result<AcuerdoDriver<ScriptFabric>, String> {
        let fabric = ScriptFabric::new(net, id);
        // Reconnect interval 0: a suspected link is retried at every poll.
        AcuerdoDriver::new(fabric, self.config(id, incarnation), now_ns, 0).map_err(|e| e.to_string())
    }

    fn cluster(&mut self, args: &Args) -> Result<String, String> {
        self.ids = args_list(args, "members")?;
        if self.ids.is_empty() {
            self.ids = vec![1, 2, 3];
        }
        self.heartbeat_timeout_ns = arg(args, "heartbeat-timeout-us", 1_000)? * US;
        self.election_timeout_ns = arg(args, "election-timeout-us", 10_000)? * US;
        self.log_gc = arg(args, "log-gc", false)?;
        self.epoch_messages = arg(args, "epoch-messages", 0)?;
        self.region_len = Layout::new(&self.config(self.ids[0], 1)).region_len;
        let net = ScriptNet::new(&self.ids, self.region_len);
        for &id in &self.ids {
            let driver = self.start(&net, id, 1, 0)?;
            self.members.insert(
                id,
                Member { driver: Some(driver), app: App::default(), incarnation: 1, next_ticket: 0 },
            );
        }
        self.net = Some(net);
        Ok(self.status())
    }

    /// One duty cycle of member `id`, as the runtime's agent runs it.
    fn poll(&mut self, id: MemberId, now_ns: u64) -> String {
        self.now_us = self.now_us.max(now_ns / US);
        let mut out = String::new();
        let Some(member) = self.members.get_mut(&id) else { return format!("no member {id}\n") };
        let Some(driver) = member.driver.as_mut() else { return String::new() };
        driver.on_fabric_events(now_ns, |_| {});
        driver.post_backlog();
        if !driver.can_poll() {
            return format!("{id}: held back by back-pressure\n");
        }
        let mut settled = Vec::new();
        driver.poll(now_ns, &mut member.app, &mut settled);
        for note in &driver.effects().notes {
            match note {
                Note::Voted(v) => {
                    let _ = writeln!(
                        out,
                        "{id}: voted for {} in {:?} (acpt {:?})",
                        v.candidate(),
                        v.e_new,
                        v.acpt
                    );
                }
                other => {
                    let _ = writeln!(out, "{id}: {other:?}");
                }
            }
        }
        for s in settled {
            if let Settled::Committed { header, .. } = s {
                let _ = writeln!(out, "{id}: committed own {header:?}");
            }
        }
        out
    }

    fn status(&self) -> String {
        let members = self.members.iter().map(|(id, m)| (u64::from(*id), m.driver.is_some().then_some(m)));
        status_lines(members, |m| {
            let e = m.driver.as_ref().expect("a live member").engine();
            let role = match e.role() {
                Role::Leader => "leader",
                Role::Follower => "follower",
                Role::Electing => "electing",
            };
            let delivered: Vec<String> =
                m.app.delivered.iter().map(|(_, p)| String::from_utf8_lossy(p).into_owned()).collect();
            format!(
                "{role} epoch={:?} accepted={:?} committed={:?} delivered=[{}]",
                e.epoch(),
                e.accepted(),
                e.committed(),
                delivered.join(" ")
            )
        })
    }
}
