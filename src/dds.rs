//! `ordo dds pub` / `ordo dds sub`: one participant of an `ordo-dds` domain
//! per process, publishing or subscribing one topic and printing rates and
//! latencies once a second, like Cyclone DDS's `ddsperf`.

use clap::{Args, Subcommand};
use ordo_dds::{Bytes, DomainParticipant, ReaderQos};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum Dds {
    /// Publish samples of a topic (this member must be one of its
    /// publishers in `[dds]`).
    Pub(PubArgs),
    /// Subscribe to a topic and report what arrives.
    Sub(SubArgs),
}

#[derive(Args)]
pub struct PubArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// The topic.
    #[arg(long)]
    pub topic: String,
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
    /// Print only one JSON summary line at the end (for `ordo bench dds`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct SubArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// The topic.
    #[arg(long)]
    pub topic: String,
    /// Stop after this many samples.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub for_s: Option<f64>,
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
    }
    Ok(p)
}

/// Why the member stopped, if it did (printed once).
fn stopped(p: &DomainParticipant) -> Option<String> {
    p.wait(Duration::ZERO).map(|e| e.to_string())
}

fn stop_now(started: Instant, for_s: Option<f64>) -> bool {
    TERMINATE.load(Ordering::Acquire) || for_s.is_some_and(|s| started.elapsed().as_secs_f64() >= s)
}

fn publish(a: PubArgs) -> Result<(), String> {
    let p = start(&a.config, a.json)?;
    let topic = p.topic::<Bytes>(&a.topic).map_err(|e| e.to_string())?;
    let writer = p.create_writer(&topic).map_err(|e| e.to_string())?;
    let say = !a.json;
    if say {
        println!(
        "publishing {:?} ({}) size {} rate {}",
        a.topic,
        topic.qos().name(),
        a.size,
        if a.rate == 0 { "max".to_string() } else { format!("{}/s", a.rate) }
    );
    }
    let key = a.key.as_bytes().to_vec();
    let started = Instant::now();
    let (mut sent, mut last_sent, mut last) = (0u64, 0u64, started);
    let mut fill = 0u8;
    while !stop_now(started, a.for_s) && a.count.is_none_or(|c| sent < c) {
        if a.rate > 0 {
            let due = started + Duration::from_secs_f64(sent as f64 / a.rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(100)));
                continue;
            }
        }
        match writer.try_write_with(&key, a.size, |b| b.fill(fill)) {
            Ok(_) => {
                sent += 1;
                fill = fill.wrapping_add(1);
            }
            Err(ordo_dds::DdsError::WouldBlock) => {
                if let Some(why) = stopped(&p) {
                    return Err(format!("the member stopped: {why}"));
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(e.to_string()),
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
    // Leave only once our samples are delivered here (so everywhere).
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.topic_stats(&topic).own < sent && Instant::now() < deadline && !TERMINATE.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let secs = started.elapsed().as_secs_f64();
    let own = p.topic_stats(&topic).own;
    if a.json {
        println!("{}", serde_json::json!({"role": "pub", "samples": sent, "delivered_here": own, "secs": secs, "size": a.size}));
    } else {
        println!(
            "done: {sent} samples in {secs:.3} s: {:.2} kS/s, {:.1} Mb/s; delivered here {own}",
            sent as f64 / secs / 1e3,
            (sent * a.size as u64 * 8) as f64 / secs / 1e6,
        );
    }
    p.leave();
    let _ = p.wait(Duration::from_secs(5));
    p.stop();
    Ok(())
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize] as f64 / 1e3
}

/// What a subscriber counted.
#[derive(Default)]
struct Tally {
    got: u64,
    bytes: u64,
    lat_ns: Vec<u64>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Tally {
    fn add(&mut self, info: &ordo_dds::SampleInfo, data: &[u8], now_ns: u64, print: bool) {
        self.got += 1;
        self.bytes += data.len() as u64;
        self.lat_ns.push(now_ns.saturating_sub(info.source_timestamp_ns));
        if print {
            println!(
                "seq {} from {} position {} view {} key {:?} {} bytes",
                info.sequence,
                info.source,
                info.position,
                info.view,
                String::from_utf8_lossy(&info.key),
                data.len()
            );
        }
    }
}

fn lock(t: &std::sync::Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

fn subscribe(a: SubArgs) -> Result<(), String> {
    let p = start(&a.config, a.json)?;
    let topic = p.topic::<Bytes>(&a.topic).map_err(|e| e.to_string())?;
    let tally = std::sync::Arc::new(std::sync::Mutex::new(Tally::default()));
    // ddsperf's default is a listener; ours is the in-place upcall.
    let (reader, _sub) = if a.queue {
        (Some(p.create_reader(&topic, ReaderQos::keep_all(a.max_samples)).map_err(|e| e.to_string())?), None)
    } else {
        let (t, print) = (tally.clone(), a.print);
        let sub = p
            .subscribe_in_place(&topic, move |info, data| {
                let now = ordo_runtime::node::unix_ns();
                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                t.add(info, data, now, print);
                let at = Instant::now();
                t.first.get_or_insert(at);
                t.last = Some(at);
            })
            .map_err(|e| e.to_string())?;
        (None, Some(sub))
    };
    let say = !a.json;
    if say {
        println!(
            "subscribed to {:?} ({}, {})",
            a.topic,
            topic.qos().name(),
            if a.queue { "KEEP_ALL reader, take" } else { "in place" }
        );
    }
    let publishers = p
        .config()
        .dds
        .topics
        .iter()
        .find(|t| t.name == a.topic)
        .map(|t| t.publishers.clone())
        .unwrap_or_default();
    let started = Instant::now();
    let (mut last_got, mut last_bytes, mut last) = (0u64, 0u64, started);
    let mut all_lat: Vec<u64> = Vec::new();
    loop {
        let got = lock(&tally).got;
        if stop_now(started, a.for_s) || a.count.is_some_and(|c| got >= c) {
            break;
        }
        let n = match &reader {
            Some(r) => {
                r.wait(Duration::from_millis(100));
                let now = ordo_runtime::node::unix_ns();
                let mut t = lock(&tally);
                let n = r.take_with(usize::MAX, |info, data| t.add(info, data, now, a.print));
                if n > 0 {
                    let at = Instant::now();
                    t.first.get_or_insert(at);
                    t.last = Some(at);
                }
                n
            }
            None => {
                std::thread::sleep(Duration::from_millis(20));
                (lock(&tally).got - got) as usize
            }
        };
        if n == 0 {
            if let Some(why) = stopped(&p) {
                if say {
                    println!("the member stopped: {why}");
                }
                break;
            }
            if a.until_publishers_leave && got > 0 && !p.status().members.iter().any(|m| publishers.contains(m)) {
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
                "{:8.3} s  received {got} (+{n})  {:.2} kS/s  {:.1} Mb/s  latency p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs  rejected {}",
                started.elapsed().as_secs_f64(),
                n as f64 / dt / 1e3,
                (b * 8) as f64 / dt / 1e6,
                percentile(&lat, 0.5),
                percentile(&lat, 0.99),
                percentile(&lat, 1.0),
                reader.as_ref().map_or(0, |r| r.status().0.rejected)
            );
            all_lat.append(&mut lat);
            (last_got, last_bytes, last) = (got, bytes, Instant::now());
        }
    }
    drop(_sub);
    let t = std::mem::take(&mut *lock(&tally));
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
                "rejected": reader.as_ref().map_or(0, |r| r.status().0.rejected),
            })
        );
    } else {
        println!(
            "done: {} samples, {} bytes in {:.3} s; latency p50 {:.1} µs p99 {:.1} µs",
            t.got,
            t.bytes,
            started.elapsed().as_secs_f64(),
            percentile(&all_lat, 0.5),
            percentile(&all_lat, 0.99)
        );
    }
    if stopped(&p).is_some() {
        p.stop();
        return Ok(());
    }
    p.leave();
    let _ = p.wait(Duration::from_secs(5));
    p.stop();
    Ok(())
}
