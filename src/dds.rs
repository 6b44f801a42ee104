//! `ordo dds pub` / `ordo dds sub` / `ordo dds log`: one participant of an
//! `ordo-dds` domain per process — a member, or with `--connect` an
//! external client of members' relays — publishing or subscribing one
//! topic and printing rates and latencies once a second, like Cyclone
//! DDS's `ddsperf`; and a member's log of a logged-storage topic.

use clap::{Args, Subcommand};
use ordo_dds::client::{ClientError, ExternalParticipant};
use ordo_dds::{Bytes, DomainParticipant, ReaderQos};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum Dds {
    /// Publish samples of a topic (as a member — which becomes one of its
    /// publishers if it is not yet; --qos creates the topic if the domain
    /// lacks it — or with --connect through a relay whose member publishes
    /// a configured topic).
    Pub(PubArgs),
    /// Subscribe to a topic and report what arrives (as a member, which
    /// joins the topic if it is not in it; or with --connect).
    Sub(SubArgs),
    /// Print a member's log of a logged-storage topic (its last segment's
    /// samples; earlier segments are counted).
    Log(LogArgs),
    /// Round trips: publish a sample on `--topic`, wait for its echo on
    /// `--reply-topic` (from `ordo dds pong`), one at a time, like
    /// `ddsperf ping`; prints the round-trip times.
    Ping(PingArgs),
    /// Echo every sample of `--topic` on `--reply-topic` from the delivery
    /// upcall, like `ddsperf pong`.
    Pong(PongArgs),
}

#[derive(Args)]
pub struct PingArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// The topic pings go out on.
    #[arg(long)]
    pub topic: String,
    /// The topic echoes come back on.
    #[arg(long)]
    pub reply_topic: String,
    /// Sample size in bytes (at least 8).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Round trips (after 100 for warm-up).
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Print only one JSON summary line at the end (for `ordo bench dds`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PongArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// The topic pings arrive on.
    #[arg(long)]
    pub topic: String,
    /// The topic echoes go out on.
    #[arg(long)]
    pub reply_topic: String,
    /// Stop after this many seconds (default: once the pinger left).
    #[arg(long)]
    pub for_s: Option<f64>,
}

/// Being an external client instead of a member.
#[derive(Args, Clone)]
pub struct ExternalArgs {
    /// Connect as an external client through these relays (`host:port`,
    /// comma-separated; the next is tried when one dies) instead of
    /// running a member.
    #[arg(long, value_delimiter = ',')]
    pub connect: Vec<String>,
    /// The cluster's client secret (with --connect).
    #[arg(long)]
    pub client_secret_file: Option<PathBuf>,
}

/// Defines the topic when `--qos` is given: the domain then creates it at
/// run time (a view change) if no configuration or participant has it yet;
/// if one has, the definition must be the same.
#[derive(Args, Clone)]
pub struct DefineArgs {
    /// QoS level of a topic to define (unordered, atomic-multicast,
    /// volatile-storage, logged-storage); without it the topic must exist.
    #[arg(long)]
    pub qos: Option<ordo_dds::QosLevel>,
    /// With --qos: the largest sample, key included.
    #[arg(long, default_value_t = 10 * 1024)]
    pub max_sample: usize,
    /// With --qos: ring slots per publisher.
    #[arg(long, default_value_t = 100)]
    pub window: usize,
    /// With --qos: samples kept (storage levels).
    #[arg(long, default_value_t = 1000)]
    pub history: usize,
}

/// The topic `name` at `p`: defined by `d` when `d.qos` is set, else one
/// the domain has.
fn member_topic(p: &DomainParticipant, name: &str, d: &DefineArgs) -> Result<ordo_dds::Topic<Bytes>, String> {
    match d.qos {
        Some(qos) => p
            .create_topic::<Bytes>(ordo_dds::TopicConfig {
                name: name.to_owned(),
                qos,
                publishers: Vec::new(),
                subscribers: Vec::new(),
                max_sample: d.max_sample,
                window: d.window,
                history: d.history,
                type_name: String::new(),
            })
            .map_err(|e| e.to_string()),
        None => p.topic::<Bytes>(name).map_err(|e| format!("{e} (give --qos to create it)")),
    }
}

/// Where `pub` and `sub` run (a member's configuration, or relays as an
/// external client) and on which topic.
#[derive(Args)]
pub struct TopicArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    #[command(flatten)]
    pub external: ExternalArgs,
    #[command(flatten)]
    pub define: DefineArgs,
    /// The topic.
    #[arg(long)]
    pub topic: String,
}

#[derive(Args)]
pub struct PubArgs {
    #[command(flatten)]
    pub on: TopicArgs,
    /// Sample size in bytes (at most the topic's max_sample).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Samples per second (0: as fast as the ring takes them).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Stop after this many samples (then wait until they are delivered).
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub for_s: Option<f64>,
    /// Instance key of every sample (empty: keyless).
    #[arg(long, default_value = "")]
    pub key: String,
    /// External client: flush (wait until stable) every this many samples.
    #[arg(long, default_value_t = 1000)]
    pub flush_every: u64,
    /// Print only one JSON summary line at the end (for `ordo bench dds`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct SubArgs {
    #[command(flatten)]
    pub on: TopicArgs,
    /// Stop after this many samples.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub for_s: Option<f64>,
    /// Stop after this many seconds without a sample (once one arrived).
    #[arg(long)]
    pub idle_exit_s: Option<f64>,
    /// Samples the reader may hold (KEEP_ALL up to this bound).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_samples: usize,
    /// Print every sample (sequence, source, position, bytes).
    #[arg(long)]
    pub print: bool,
    /// Read through a KEEP_ALL `DataReader` (`take` on this thread) instead
    /// of the in-place upcall (the default, like ddsperf's listener).
    #[arg(long)]
    pub queue: bool,
    /// Stop once no publisher of the topic is in the view any more (or this
    /// member stopped), after having received at least one sample.
    #[arg(long)]
    pub until_publishers_leave: bool,
    /// Print only one JSON summary line at the end (for `ordo bench dds`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct LogArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// The topic.
    #[arg(long)]
    pub topic: String,
    /// Print every sample of the last segment (default: a summary).
    #[arg(long)]
    pub samples: bool,
}

static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::Release);
}

fn install_handlers() {
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGTERM, on_terminate as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_terminate as *const () as libc::sighandler_t);
    }
}

pub fn main(cmd: Dds) -> Result<(), String> {
    install_handlers();
    match cmd {
        Dds::Pub(a) => publish(a),
        Dds::Sub(a) => subscribe(a),
        Dds::Log(a) => log(a),
        Dds::Ping(a) => ping(a),
        Dds::Pong(a) => pong(a),
    }
}

fn start(config: &crate::ConfigArgs, quiet: bool) -> Result<DomainParticipant, String> {
    let config = crate::load_config(config)?;
    let p = DomainParticipant::new(&config).map_err(|e| format!("member {}: {e}", config.member.id))?;
    if !p.wait_running(Duration::from_secs(60)) {
        return Err(format!("member {}: not running after 60 s ({:?})", config.member.id, p.status().state));
    }
    let st = p.status();
    if !quiet {
        println!("ordo dds: member {} in view {} of {:?}", st.member, st.view, st.members);
        if let Some(a) = p.relay_addr() {
            println!("relay for external clients on {a}");
        }
    }
    Ok(p)
}

fn connect(e: &ExternalArgs, quiet: bool) -> Result<ExternalParticipant, String> {
    let file = e.client_secret_file.as_ref().ok_or("--connect needs --client-secret-file")?;
    let secret = ordo_runtime::Secret::from_file(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let c = ExternalParticipant::connect(&e.connect, &secret).map_err(|e| e.to_string())?;
    if !quiet {
        println!("ordo dds: external client of member {}'s relay", c.relay_member());
    }
    Ok(c)
}

/// Why the member stopped, if it did.
fn stopped(p: &DomainParticipant) -> Option<String> {
    p.wait(Duration::ZERO).map(|e| e.to_string())
}

fn stop_now(started: Instant, for_s: Option<f64>) -> bool {
    TERMINATE.load(Ordering::Acquire) || for_s.is_some_and(|s| started.elapsed().as_secs_f64() >= s)
}

/// Where a publisher's samples go.
enum Out {
    Member(Box<DomainParticipant>, ordo_dds::DataWriter<Bytes>, ordo_dds::Topic<Bytes>),
    External(ExternalParticipant, ordo_dds::client::ExternalWriter),
}

fn publish(a: PubArgs) -> Result<(), String> {
    let say = !a.json;
    let out = if a.on.external.connect.is_empty() {
        let p = start(&a.on.config, a.json)?;
        let topic = member_topic(&p, &a.on.topic, &a.on.define)?;
        let writer = p.create_writer(&topic).map_err(|e| e.to_string())?;
        if say {
            println!("publishing {:?} ({}) size {}", a.on.topic, topic.qos().name(), a.size);
        }
        Out::Member(Box::new(p), writer, topic)
    } else {
        let c = connect(&a.on.external, a.json)?;
        let w = c.writer(&a.on.topic, "bytes").map_err(|e| e.to_string())?;
        if say {
            println!("publishing {:?} through the relay, size {}", a.on.topic, a.size);
        }
        Out::External(c, w)
    };
    let key = a.key.as_bytes().to_vec();
    let started = Instant::now();
    let (mut sent, mut stable, mut last_sent, mut last) = (0u64, 0u64, 0u64, started);
    // External: samples up to `vouched` were covered by a flush (stable or
    // in doubt); `stable` counts those a successful flush vouched for.
    let mut vouched = 0u64;
    let mut data = vec![0u8; a.size];
    while !stop_now(started, a.for_s) && a.count.is_none_or(|c| sent < c) {
        if a.rate > 0 {
            let due = started + Duration::from_secs_f64(sent as f64 / a.rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(100)));
                continue;
            }
        }
        let fill = (sent % 251) as u8;
        match &out {
            Out::Member(p, w, _) => match w.try_write_with(&key, a.size, |b| b.fill(fill)) {
                Ok(_) => sent += 1,
                Err(ordo_dds::DdsError::WouldBlock) => {
                    if let Some(why) = stopped(p) {
                        return Err(format!("the member stopped: {why}"));
                    }
                    std::thread::yield_now();
                }
                Err(e) => return Err(e.to_string()),
            },
            Out::External(c, w) => {
                data.fill(fill);
                match w.write(&key, &data) {
                    Ok(()) => {
                        sent += 1;
                        if sent % a.flush_every.max(1) == 0 {
                            if w.flush().is_ok() {
                                stable += sent - vouched;
                            }
                            vouched = sent;
                        }
                    }
                    Err(ClientError::Disconnected) => {
                        if !c.wait_connected(Duration::from_secs(30)) {
                            return Err("no relay for 30 s".into());
                        }
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        if say && last.elapsed() >= Duration::from_secs(1) {
            let dt = last.elapsed().as_secs_f64();
            let n = sent - last_sent;
            println!(
                "{:8.3} s  sent {sent} (+{n})  {:.2} kS/s  {:.1} Mb/s",
                started.elapsed().as_secs_f64(),
                n as f64 / dt / 1e3,
                (n * a.size as u64 * 8) as f64 / dt / 1e6
            );
            (last_sent, last) = (sent, Instant::now());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    match out {
        Out::Member(p, _, topic) => {
            // Leave only once our samples are delivered here (so everywhere).
            let deadline = Instant::now() + Duration::from_secs(30);
            while p.topic_stats(&topic).own < sent
                && Instant::now() < deadline
                && !TERMINATE.load(Ordering::Acquire)
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            let own = p.topic_stats(&topic).own;
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"role": "pub", "samples": sent, "stable": own, "secs": secs, "size": a.size})
                );
            } else {
                println!(
                    "done: {sent} samples in {secs:.3} s: {:.2} kS/s, {:.1} Mb/s; delivered {own}",
                    sent as f64 / secs / 1e3,
                    (sent * a.size as u64 * 8) as f64 / secs / 1e6,
                );
            }
            p.leave();
            let _ = p.wait(Duration::from_secs(5));
            p.stop();
        }
        Out::External(c, w) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                match w.flush() {
                    Ok(()) => {
                        stable += sent - vouched;
                        break;
                    }
                    Err(_) => {
                        // What was written since the last good flush is
                        // in doubt; the next flush vouches for nothing new.
                        vouched = sent;
                        c.wait_connected(Duration::from_secs(5));
                    }
                }
            }
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"role": "pub", "samples": sent, "stable": stable, "secs": secs, "size": a.size, "reconnects": c.reconnects()})
                );
            } else {
                println!(
                    "done: {sent} samples in {secs:.3} s, {stable} stable; {} reconnects",
                    c.reconnects()
                );
            }
        }
    }
    Ok(())
}

/// What a subscriber counted.
#[derive(Default)]
struct Tally {
    got: u64,
    bytes: u64,
    lat_ns: Vec<u64>,
    first: Option<Instant>,
    last: Option<Instant>,
    first_position: Option<u64>,
    last_position: u64,
    in_order: bool,
    digest: u64,
    /// Samples at or below this position were history when the subscriber
    /// started: counted, but kept out of the latency figures.
    live_after: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally { in_order: true, digest: 0xcbf2_9ce4_8422_2325, ..Tally::default() }
    }

    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        source: u32,
        seq: u64,
        position: u64,
        view: u64,
        source_ns: u64,
        key: &[u8],
        len: usize,
        print: bool,
    ) {
        let now = ordo_runtime::node::unix_ns();
        self.got += 1;
        self.bytes += len as u64;
        if position > self.live_after {
            self.lat_ns.push(now.saturating_sub(source_ns));
        }
        self.first_position.get_or_insert(position);
        if position <= self.last_position {
            self.in_order = false;
        }
        self.last_position = position;
        for w in [u64::from(source), seq, position] {
            for b in w.to_le_bytes() {
                self.digest ^= u64::from(b);
                self.digest = self.digest.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        let at = Instant::now();
        self.first.get_or_insert(at);
        self.last = Some(at);
        if print {
            println!(
                "seq {seq} from {source} position {position} view {view} key {:?} {len} bytes",
                String::from_utf8_lossy(key)
            );
        }
    }
}

fn lock(t: &Mutex<Tally>) -> MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize] as f64 / 1e3
}

/// Where a subscriber's samples come from.
enum In {
    Upcall(DomainParticipant, ordo_dds::InPlaceSubscription),
    Queue(DomainParticipant, ordo_dds::DataReader<Bytes>),
    External(ExternalParticipant, ordo_dds::client::ExternalSubscription),
}

fn subscribe(a: SubArgs) -> Result<(), String> {
    let tally = Arc::new(Mutex::new(Tally::new()));
    let say = !a.json;
    let (input, publishers) = if a.on.external.connect.is_empty() {
        let p = start(&a.on.config, a.json)?;
        let topic = member_topic(&p, &a.on.topic, &a.on.define)?;
        let publishers = p
            .config()
            .dds
            .topics
            .iter()
            .find(|t| t.name == a.on.topic)
            .map(|t| t.publishers.clone())
            .unwrap_or_default();
        lock(&tally).live_after = p.topic_stats(&topic).delivered;
        if say {
            println!(
                "subscribed to {:?} ({}, {})",
                a.on.topic,
                topic.qos().name(),
                if a.queue { "KEEP_ALL reader, take" } else { "in place" }
            );
        }
        let input = if a.queue {
            let r = p.create_reader(&topic, ReaderQos::keep_all(a.max_samples)).map_err(|e| e.to_string())?;
            In::Queue(p, r)
        } else {
            let (t, print) = (tally.clone(), a.print);
            let sub = p
                .subscribe_in_place(&topic, move |i, data| {
                    lock(&t).add(
                        i.source,
                        i.sequence,
                        i.position,
                        i.view,
                        i.source_timestamp_ns,
                        &i.key,
                        data.len(),
                        print,
                    )
                })
                .map_err(|e| e.to_string())?;
            In::Upcall(p, sub)
        };
        (input, publishers)
    } else {
        let c = connect(&a.on.external, a.json)?;
        let s = c.subscribe(&a.on.topic, "bytes", a.max_samples).map_err(|e| e.to_string())?;
        if say {
            println!("subscribed to {:?} through the relay", a.on.topic);
        }
        (In::External(c, s), Vec::new())
    };
    let started = Instant::now();
    let (mut last_got, mut last_bytes, mut last) = (0u64, 0u64, started);
    let mut all_lat: Vec<u64> = Vec::new();
    loop {
        let (got, last_at) = {
            let t = lock(&tally);
            (t.got, t.last)
        };
        if stop_now(started, a.for_s)
            || a.count.is_some_and(|c| got >= c)
            || a.idle_exit_s.is_some_and(|s| last_at.is_some_and(|l| l.elapsed().as_secs_f64() >= s))
        {
            break;
        }
        match &input {
            In::Queue(_, r) => {
                r.wait(Duration::from_millis(100));
                let mut t = lock(&tally);
                r.take_with(usize::MAX, |i, data| {
                    t.add(
                        i.source,
                        i.sequence,
                        i.position,
                        i.view,
                        i.source_timestamp_ns,
                        &i.key,
                        data.len(),
                        a.print,
                    )
                });
            }
            In::Upcall(..) => std::thread::sleep(Duration::from_millis(20)),
            In::External(_, s) => {
                s.wait(Duration::from_millis(100));
                let mut t = lock(&tally);
                for x in s.take(usize::MAX) {
                    t.add(
                        x.source,
                        x.sequence,
                        x.position,
                        x.view,
                        x.source_timestamp_ns,
                        &x.key,
                        x.data.len(),
                        a.print,
                    );
                }
            }
        }
        if let In::Upcall(p, _) | In::Queue(p, _) = &input
            && lock(&tally).got == got
        {
            if let Some(why) = stopped(p) {
                if say {
                    println!("the member stopped: {why}");
                }
                break;
            }
            if a.until_publishers_leave
                && got > 0
                && !p.status().members.iter().any(|m| publishers.contains(m))
            {
                break;
            }
        }
        if say && last.elapsed() >= Duration::from_secs(1) {
            let dt = last.elapsed().as_secs_f64();
            let (got, bytes, mut lat) = {
                let mut t = lock(&tally);
                (t.got, t.bytes, std::mem::take(&mut t.lat_ns))
            };
            lat.sort_unstable();
            let (n, b) = (got - last_got, bytes - last_bytes);
            println!(
                "{:8.3} s  received {got} (+{n})  {:.2} kS/s  {:.1} Mb/s  latency p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs",
                started.elapsed().as_secs_f64(),
                n as f64 / dt / 1e3,
                (b * 8) as f64 / dt / 1e6,
                percentile(&lat, 0.5),
                percentile(&lat, 0.99),
                percentile(&lat, 1.0),
            );
            all_lat.append(&mut lat);
            (last_got, last_bytes, last) = (got, bytes, Instant::now());
        }
    }
    let (rejected, reconnects) = match &input {
        In::Queue(_, r) => (r.status().0.rejected, 0),
        In::External(c, s) => (s.rejected(), c.reconnects()),
        In::Upcall(..) => (0, 0),
    };
    let member = match input {
        In::Upcall(p, sub) => {
            drop(sub);
            Some(p)
        }
        In::Queue(p, _) => Some(p),
        In::External(..) => None,
    };
    let t = std::mem::replace(&mut *lock(&tally), Tally::new());
    all_lat.extend_from_slice(&t.lat_ns);
    all_lat.sort_unstable();
    let window = match (t.first, t.last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "role": "sub", "samples": t.got, "bytes": t.bytes, "window_secs": window,
                "p50_us": percentile(&all_lat, 0.5), "p99_us": percentile(&all_lat, 0.99),
                "rejected": rejected, "first_position": t.first_position, "last_position": t.last_position,
                "in_order": t.in_order, "order_digest": format!("{:016x}", t.digest), "reconnects": reconnects,
            })
        );
    } else {
        println!(
            "done: {} samples, {} bytes in {:.3} s (positions {:?}..={}, in order: {}); latency p50 {:.1} µs p99 {:.1} µs",
            t.got,
            t.bytes,
            started.elapsed().as_secs_f64(),
            t.first_position,
            t.last_position,
            t.in_order,
            percentile(&all_lat, 0.5),
            percentile(&all_lat, 0.99)
        );
    }
    if let Some(p) = member {
        if stopped(&p).is_none() {
            p.leave();
            let _ = p.wait(Duration::from_secs(5));
        }
        p.stop();
    }
    Ok(())
}

fn log(a: LogArgs) -> Result<(), String> {
    let config = crate::load_config(&a.config)?;
    let t = config.dds.topics.iter().find(|t| t.name == a.topic).ok_or(format!("no topic {:?}", a.topic))?;
    let dir = ordo_dds::log_dir(&config, config.member.id, &t.name);
    let disk = ordo_r2p2::disk::FsDisk::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let report = ordo_dds::core::read_log(disk, t).map_err(|e| format!("{}: {e}", dir.display()))?;
    println!(
        "{}: {} records, {} segments; the last holds positions {:?}..={}",
        dir.display(),
        report.records,
        report.segments,
        report.samples.first().map(|s| s.position),
        report.samples.last().map_or(0, |s| s.position)
    );
    if a.samples {
        for s in &report.samples {
            println!(
                "position {} view {} from {} seq {} key {:?} {} bytes",
                s.position,
                s.view,
                s.sender,
                s.envelope.seq,
                String::from_utf8_lossy(s.key()),
                s.data().len()
            );
        }
    }
    Ok(())
}

fn ping(a: PingArgs) -> Result<(), String> {
    use std::sync::atomic::AtomicU64;
    if a.size < 8 {
        return Err("--size is at least 8 (the echo carries the ping's number)".into());
    }
    let p = start(&a.config, a.json)?;
    let out = p.topic::<Bytes>(&a.topic).map_err(|e| e.to_string())?;
    let back = p.topic::<Bytes>(&a.reply_topic).map_err(|e| e.to_string())?;
    let w = p.create_writer(&out).map_err(|e| e.to_string())?;
    let echoed = Arc::new(AtomicU64::new(0));
    let e = echoed.clone();
    let _sub = p
        .subscribe_in_place(&back, move |_, data| {
            if let Some(b) = data.get(..8) {
                e.store(u64::from_le_bytes(b.try_into().expect("8 bytes")), Ordering::Release);
            }
        })
        .map_err(|e| e.to_string())?;
    const WARM: u64 = 100;
    let mut rtt_ns: Vec<u64> = Vec::with_capacity(a.count as usize);
    let send = |i: u64| {
        w.write_with(&[], a.size, |b| {
            b[..8].copy_from_slice(&i.to_le_bytes());
            b[8..].fill(i as u8);
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    for i in 1..=a.count + WARM {
        let t0 = Instant::now();
        send(i)?;
        let mut resent = t0;
        // Spin briefly, then yield: the echo comes back in microseconds.
        let mut spins = 0u32;
        while echoed.load(Ordering::Acquire) != i {
            if t0.elapsed() > Duration::from_secs(5) {
                return Err(format!("no echo of ping {i} within 5 s (is `ordo dds pong` running?)"));
            }
            // Warm-up: the ponger may not be subscribed yet; ask again.
            if i <= WARM && resent.elapsed() > Duration::from_millis(50) {
                send(i)?;
                resent = Instant::now();
            }
            spins += 1;
            if spins < 200 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if i > WARM {
            rtt_ns.push(t0.elapsed().as_nanos() as u64);
        }
    }
    rtt_ns.sort_unstable();
    let mean = rtt_ns.iter().sum::<u64>() as f64 / rtt_ns.len().max(1) as f64 / 1e3;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"role": "ping", "count": rtt_ns.len(), "size": a.size, "mean_us": mean,
                "min_us": percentile(&rtt_ns, 0.0), "p50_us": percentile(&rtt_ns, 0.5),
                "p90_us": percentile(&rtt_ns, 0.9), "p99_us": percentile(&rtt_ns, 0.99), "max_us": percentile(&rtt_ns, 1.0)})
        );
    } else {
        println!(
            "size {} round trips {}: mean {mean:.1} µs min {:.1} 50% {:.1} 90% {:.1} 99% {:.1} max {:.1}",
            a.size,
            rtt_ns.len(),
            percentile(&rtt_ns, 0.0),
            percentile(&rtt_ns, 0.5),
            percentile(&rtt_ns, 0.9),
            percentile(&rtt_ns, 0.99),
            percentile(&rtt_ns, 1.0)
        );
    }
    p.leave();
    let _ = p.wait(Duration::from_secs(5));
    p.stop();
    Ok(())
}

fn pong(a: PongArgs) -> Result<(), String> {
    let p = start(&a.config, true)?;
    let inp = p.topic::<Bytes>(&a.topic).map_err(|e| e.to_string())?;
    let out = p.topic::<Bytes>(&a.reply_topic).map_err(|e| e.to_string())?;
    let w = p.create_writer(&out).map_err(|e| e.to_string())?;
    let pinger: Vec<u32> = p
        .config()
        .dds
        .topics
        .iter()
        .find(|t| t.name == a.topic)
        .map(|t| t.publishers.clone())
        .unwrap_or_default();
    let missed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let m = missed.clone();
    // The echo is written from the delivery upcall itself: a lock-free slot
    // claim, never a wait (a full ring is counted, not waited for).
    let _sub = p
        .subscribe_in_place(&inp, move |_, data| {
            if w.try_write_with(&[], data.len(), |b| b.copy_from_slice(data)).is_err() {
                m.fetch_add(1, Ordering::Relaxed);
            }
        })
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut seen_pinger = false;
    while !stop_now(started, a.for_s) && stopped(&p).is_none() {
        let here = p.status().members.iter().any(|x| pinger.contains(x));
        if seen_pinger && !here {
            break;
        }
        seen_pinger |= here;
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(_sub);
    if missed.load(Ordering::Relaxed) > 0 {
        eprintln!("{} pings not echoed (the reply ring was full)", missed.load(Ordering::Relaxed));
    }
    if stopped(&p).is_none() {
        p.leave();
        let _ = p.wait(Duration::from_secs(5));
    }
    p.stop();
    Ok(())
}
