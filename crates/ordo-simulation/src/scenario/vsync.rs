//! The vsync scenario driver: one `ordo_vsync::VsyncDriver` (the type the
//! runtime's predicate agent wraps) per member over a [`ScriptFabric`].
//!
//! Commands:
//! - `group members=(0,1,2) [senders=(0,1,2)] [window=4] [max-payload=64]
//!   [mode=ordered|unordered] [switches=spindle|baseline]` — one subgroup
//! - `send ID data=X` — the application of ID sends X (lock-free, in place)
//! - `declare ID rounds=R` — ID declares R rounds of inactivity (§III-B)
//! - `round [n=1]` — every live member runs one predicate-thread duty cycle,
//!   then every write lands; prints each delivery (`M: seq=S from=F X`)
//! - `poll ID` — one duty cycle of ID only (its writes stay queued)
//! - `deliver [from=S to=(D,...)]` — lets queued writes land (all without
//!   arguments)
//! - `crash ID` — ID dies; the others suspect it (and wedge: one view)
//! - `status` — per member: delivered_num, nulls sent, wedged, idle

use super::{Args, ScriptFabric, ScriptNet, arg, args_list, member_arg, status_lines};
use ordo_fabric::MemberId;
use ordo_vsync::{
    Delivered, DeliveryMode, GroupConfig, GroupLayout, Sender, SubgroupConfig, Switches, VsyncDriver,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;

struct Member {
    driver: Option<VsyncDriver<ScriptFabric>>,
    sender: Option<Sender>,
}

/// A scripted vsync group with one subgroup.
#[derive(Default)]
pub struct VsyncCluster {
    net: Option<Rc<RefCell<ScriptNet>>>,
    members: BTreeMap<MemberId, Member>,
}

impl VsyncCluster {
    /// Runs one script command; returns what it prints.
    pub fn handle(&mut self, directive: &str, args: &Args, _input: &str) -> Result<String, String> {
        match directive {
            "group" => self.group(args),
            "send" => {
                let id = member_arg(args, "send")? as MemberId;
                let data: String = arg(args, "data", String::new())?;
                let sender = self.members.get(&id).and_then(|m| m.sender.as_ref()).ok_or("not a sender")?;
                let bytes = data.as_bytes();
                Ok(match sender.try_send_with(bytes.len(), |buf| buf.copy_from_slice(bytes)) {
                    Ok(()) => String::new(),
                    Err(e) => format!("refused: {e}\n"),
                })
            }
            "declare" => {
                let id = member_arg(args, "declare")? as MemberId;
                let rounds: u64 = arg(args, "rounds", 1)?;
                let sender = self.members.get(&id).and_then(|m| m.sender.as_ref()).ok_or("not a sender")?;
                sender.declare_inactive(rounds);
                Ok(String::new())
            }
            "round" => {
                let n: usize = arg(args, "n", 1)?;
                let mut out = String::new();
                for _ in 0..n {
                    let ids: Vec<MemberId> = self.members.keys().copied().collect();
                    for id in ids {
                        out += &self.poll(id);
                    }
                    self.net()?.borrow_mut().deliver_all();
                }
                Ok(out)
            }
            "poll" => {
                let id = member_arg(args, "poll")? as MemberId;
                Ok(self.poll(id))
            }
            "deliver" => self.net()?.borrow_mut().deliver_command(args),
            "crash" => {
                let id = member_arg(args, "crash")? as MemberId;
                self.net()?.borrow_mut().crash(id);
                let member = self.members.get_mut(&id).ok_or("no such member")?;
                member.driver = None;
                member.sender = None;
                Ok(String::new())
            }
            "queues" => Ok(self.net()?.borrow().describe_queues()),
            "status" => Ok(self.status()),
            other => Err(format!("unknown command {other}")),
        }
    }

    fn net(&self) -> Result<Rc<RefCell<ScriptNet>>, String> {
        self.net.clone().ok_or_else(|| "no group yet".to_string())
    }

    fn group(&mut self, args: &Args) -> Result<String, String> {
        let mut members: Vec<MemberId> = args_list(args, "members")?;
        if members.is_empty() {
            members = vec![0, 1, 2];
        }
        let mut senders: Vec<MemberId> = args_list(args, "senders")?;
        if senders.is_empty() {
            senders = members.clone();
        }
        let mode = match arg(args, "mode", "ordered".to_string())?.as_str() {
            "ordered" => DeliveryMode::Ordered,
            "unordered" => DeliveryMode::Unordered,
            m => return Err(format!("unknown mode {m}")),
        };
        let switches = match arg(args, "switches", "spindle".to_string())?.as_str() {
            "spindle" => Switches::SPINDLE,
            "baseline" => Switches::BASELINE,
            s => return Err(format!("unknown switches {s}")),
        };
        let group = GroupConfig {
            members: members.clone(),
            subgroups: vec![SubgroupConfig {
                name: String::new(),
                descriptor: Vec::new(),
                members: members.clone(),
                senders,
                window: arg(args, "window", 4)?,
                max_payload: arg(args, "max-payload", 64)?,
                mode,
            }],
            switches,
        };
        group.validate().map_err(|e| e.to_string())?;
        let len = GroupLayout::new(&group).region_len.next_multiple_of(64);
        let net = ScriptNet::new(&members, len);
        for &id in &members {
            let (driver, mut senders) =
                VsyncDriver::new(ScriptFabric::new(&net, id), group.clone()).map_err(|e| e.to_string())?;
            let sender = senders.pop().flatten();
            self.members.insert(id, Member { driver: Some(driver), sender });
        }
        self.net = Some(net);
        Ok(self.status())
    }

    /// One predicate-thread duty cycle of `id`; returns its deliveries.
    fn poll(&mut self, id: MemberId) -> String {
        let mut out = String::new();
        let Some(driver) = self.members.get_mut(&id).and_then(|m| m.driver.as_mut()) else { return out };
        let mut sink = |batch: &[Delivered<'_>]| {
            for d in batch {
                let _ = writeln!(
                    out,
                    "{id}: seq={} from={} {}",
                    d.seq,
                    d.sender,
                    String::from_utf8_lossy(d.payload)
                );
            }
        };
        driver.do_work(&mut sink);
        if !driver.suspected().is_empty() && driver.engine().is_wedged() {
            let _ = writeln!(out, "{id}: wedged (suspects {:?})", driver.suspected());
        }
        out
    }

    fn status(&self) -> String {
        let members = self.members.iter().map(|(id, m)| (u64::from(*id), m.driver.as_ref()));
        status_lines(members, |driver| {
            let e = driver.engine();
            format!(
                "delivered_num={} nulls_sent={} wedged={} idle={}",
                e.delivered_num(0),
                e.stats(0).nulls_sent,
                e.is_wedged(),
                driver.is_idle()
            )
        })
    }
}
