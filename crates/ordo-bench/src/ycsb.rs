//! One YCSB driver for every system (`ordo bench kv --ycsb`): the core
//! workloads' operation mixes and request distributions, written here so
//! ordo-kv (RESP), a single redis-server (RESP), etcd (its v3 API through
//! the `etcd-client` crate) and ZooKeeper (the `zookeeper-client` crate)
//! run the same operations from the same code in one run.
//!
//! - Records: `recordcount` keys `user<fnv64(i)>` (YCSB's hashed insert
//!   order), each a value of 10 fields × 100 bytes stored as one 1,000-byte
//!   value (every store here is a flat key-value map).
//! - Request distribution: zipfian with θ = 0.99 (YCSB's constant), its
//!   item scrambled by an FNV hash so hot keys are spread; workload D reads
//!   the latest inserts (zipfian over recency).
//! - Workloads: load (inserts), A (50 % read, 50 % update), B (95/5),
//!   C (read only), D (95 % read latest, 5 % insert), F (50 % read, 50 %
//!   read-modify-write). E (range scans) is not run: ordo-kv's command set
//!   has no ordered range scan.
//! - Threads: `threads` clients, each with its own connection, each doing
//!   `operations / threads` operations back to back; latency per operation
//!   into an HDR histogram.

use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// A key-value store as YCSB drives it.
pub trait Store {
    /// Insert a new record.
    fn insert(&mut self, key: &str, value: &[u8]) -> Result<(), String>;
    /// Read a record (whether it exists).
    fn read(&mut self, key: &str) -> Result<bool, String>;
    /// Overwrite a record.
    fn update(&mut self, key: &str, value: &[u8]) -> Result<(), String>;
}

/// A workload's operation mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Inserts of every record.
    Load,
    /// 50 % read, 50 % update.
    A,
    /// 95 % read, 5 % update.
    B,
    /// Reads only.
    C,
    /// 95 % read (latest), 5 % insert.
    D,
    /// 50 % read, 50 % read-modify-write.
    F,
}

impl Workload {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Load => "load",
            Workload::A => "A",
            Workload::B => "B",
            Workload::C => "C",
            Workload::D => "D",
            Workload::F => "F",
        }
    }
}

/// SplitMix64: a small, fast generator (the driver's only randomness).
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// YCSB's zipfian generator (Gray et al.) over `[0, n)`, θ = 0.99.
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// YCSB's constant.
    pub const THETA: f64 = 0.99;

    /// Over `[0, n)`.
    pub fn new(n: u64) -> Zipfian {
        let theta = Self::THETA;
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n.max(1));
        let zeta2 = zeta(2);
        let eta = (1.0 - (2.0 / n.max(2) as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian { n: n.max(1), theta, alpha: 1.0 / (1.0 - theta), zetan, eta }
    }

    /// The next item (0 is the most popular).
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        ((self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64).min(self.n - 1)
    }
}

fn fnv64(mut x: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        h ^= x & 0xFF;
        h = h.wrapping_mul(0x0100_0000_01B3);
        x >>= 8;
    }
    h
}

/// The key of record `i`.
pub fn key(i: u64) -> String {
    format!("user{}", fnv64(i))
}

/// A 1,000-byte value (10 fields of 100 bytes) derived from `seed`.
pub fn value(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..1000).map(|_| b'a' + (rng.next_u64() % 26) as u8).collect()
}

/// What one workload run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    /// Operations completed.
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Wall time.
    pub seconds: f64,
    /// Latency p50, µs.
    pub p50_us: f64,
    /// Latency p99, µs.
    pub p99_us: f64,
    /// The first error, if any.
    pub first_error: Option<String>,
}

impl Outcome {
    /// Operations per second.
    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.seconds.max(1e-9)
    }
}

/// One client thread's histogram, operations, errors and first error.
type ThreadResult = Result<(Histogram<u64>, u64, u64, Option<String>), String>;

/// Runs `workload` with `threads` clients made by `connect(thread)`:
/// `records` records exist (or are inserted, for `Load`), `operations` in
/// all.
pub fn run<S: Store>(
    workload: Workload,
    records: u64,
    operations: u64,
    threads: usize,
    connect: impl Fn(usize) -> Result<S, String> + Sync,
) -> Result<Outcome, String> {
    let threads = threads.max(1);
    let zipf = Zipfian::new(records);
    let start = Instant::now();
    let results: Vec<ThreadResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (zipf, connect) = (&zipf, &connect);
                scope.spawn(move || {
                    let mut store = connect(t)?;
                    let mut rng = Rng::new(0x5EED ^ (t as u64) << 32 ^ workload as u64);
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                    let (mut ops, mut errors, mut first) = (0u64, 0u64, None);
                    let mut note = |r: Result<(), String>, t0: Instant, errors: &mut u64| {
                        hist.record(t0.elapsed().as_micros().max(1) as u64).ok();
                        if let Err(e) = r {
                            *errors += 1;
                            first.get_or_insert(e);
                        }
                    };
                    let (lo, hi) = if workload == Workload::Load {
                        (records * t as u64 / threads as u64, records * (t as u64 + 1) / threads as u64)
                    } else {
                        (0, operations / threads as u64)
                    };
                    // Workload D inserts beyond the loaded records (each
                    // thread its own range) and reads the latest first.
                    let mut own: Vec<u64> = Vec::new();
                    for i in lo..hi {
                        let t0 = Instant::now();
                        let r = match workload {
                            Workload::Load => store.insert(&key(i), &value(i)),
                            _ => {
                                let p = rng.f64();
                                let k = match workload {
                                    Workload::D => {
                                        let back = zipf.next(&mut rng) as usize;
                                        match own.len().checked_sub(back + 1) {
                                            Some(j) => own[j],
                                            None => records.saturating_sub(1 + (back - own.len()) as u64),
                                        }
                                    }
                                    _ => fnv64(zipf.next(&mut rng)) % records,
                                };
                                let k = key(k);
                                match workload {
                                    Workload::A if p < 0.5 => store.update(&k, &value(i)),
                                    Workload::B if p < 0.05 => store.update(&k, &value(i)),
                                    Workload::D if p < 0.05 => {
                                        let new = records + (t as u64) * operations + own.len() as u64;
                                        own.push(new);
                                        store.insert(&key(new), &value(i))
                                    }
                                    Workload::F if p < 0.5 => {
                                        store.read(&k).and_then(|_| store.update(&k, &value(i)))
                                    }
                                    _ => store.read(&k).map(|_| ()),
                                }
                            }
                        };
                        ops += 1;
                        note(r, t0, &mut errors);
                    }
                    Ok((hist, ops, errors, first))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a client thread panicked".into())))
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut ops, mut errors, mut first_error) = (0, 0, None);
    for r in results {
        let (h, o, e, f) = r?;
        all.add(&h).map_err(|e| e.to_string())?;
        ops += o;
        errors += e;
        first_error = first_error.or(f);
    }
    Ok(Outcome {
        ops: ops - errors,
        errors,
        seconds,
        p50_us: all.value_at_quantile(0.5) as f64,
        p99_us: all.value_at_quantile(0.99) as f64,
        first_error,
    })
}

/// RESP (ordo-kv, redis-server).
pub struct Resp(ordo_kv::client::Client);

impl Resp {
    /// Connects to `addr` (with `password`).
    pub fn connect(addr: std::net::SocketAddr, password: Option<&[u8]>) -> Result<Resp, String> {
        ordo_kv::client::Client::connect(addr, password, Duration::from_secs(10))
            .map(Resp)
            .map_err(|e| e.to_string())
    }
}

impl Store for Resp {
    fn insert(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        self.update(key, value)
    }
    fn read(&mut self, key: &str) -> Result<bool, String> {
        match self.0.call(&[b"GET", key.as_bytes()]).map_err(|e| e.to_string())? {
            ordo_kv::Reply::Bulk(_) => Ok(true),
            ordo_kv::Reply::Nil => Ok(false),
            other => Err(format!("GET: {other:?}")),
        }
    }
    fn update(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        match self.0.call(&[b"SET", key.as_bytes(), value]).map_err(|e| e.to_string())? {
            ordo_kv::Reply::Ok => Ok(()),
            other => Err(format!("SET: {other:?}")),
        }
    }
}

/// etcd's v3 API (a 3-member cluster: the client balances over the
/// endpoints; every request is linearizable, etcd's default).
#[cfg(feature = "peers")]
pub struct Etcd {
    rt: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

#[cfg(feature = "peers")]
impl Etcd {
    /// Connects to `endpoints`.
    pub fn connect(endpoints: &[String]) -> Result<Etcd, String> {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let client = rt.block_on(etcd_client::Client::connect(endpoints, None)).map_err(|e| e.to_string())?;
        Ok(Etcd { rt, client })
    }
}

#[cfg(feature = "peers")]
impl Store for Etcd {
    fn insert(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        self.update(key, value)
    }
    fn read(&mut self, key: &str) -> Result<bool, String> {
        let r = self.rt.block_on(self.client.get(key, None)).map_err(|e| e.to_string())?;
        Ok(!r.kvs().is_empty())
    }
    fn update(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        self.rt.block_on(self.client.put(key, value, None)).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// ZooKeeper: one znode per record under `/ycsb`.
#[cfg(feature = "peers")]
pub struct Zk {
    rt: tokio::runtime::Runtime,
    client: zookeeper_client::Client,
}

#[cfg(feature = "peers")]
impl Zk {
    /// Connects to `cluster` (`host:port,host:port,...`) and makes `/ycsb`.
    pub fn connect(cluster: &str) -> Result<Zk, String> {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let client = rt.block_on(zookeeper_client::Client::connect(cluster)).map_err(|e| e.to_string())?;
        let opts = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
        match rt.block_on(client.create("/ycsb", b"", &opts)) {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => return Err(e.to_string()),
        }
        Ok(Zk { rt, client })
    }
}

#[cfg(feature = "peers")]
impl Store for Zk {
    fn insert(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        let opts = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
        match self.rt.block_on(self.client.create(&format!("/ycsb/{key}"), value, &opts)) {
            Ok(_) => Ok(()),
            Err(zookeeper_client::Error::NodeExists) => self.update(key, value),
            Err(e) => Err(e.to_string()),
        }
    }
    fn read(&mut self, key: &str) -> Result<bool, String> {
        match self.rt.block_on(self.client.get_data(&format!("/ycsb/{key}"))) {
            Ok(_) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
    fn update(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        self.rt
            .block_on(self.client.set_data(&format!("/ycsb/{key}"), value, None))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipfian_is_skewed_and_in_range() {
        let z = Zipfian::new(1000);
        let mut rng = Rng::new(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.next(&mut rng) as usize] += 1;
        }
        // θ = 0.99: item 0 takes roughly 1/zeta(1000) ≈ 13 % of draws, and
        // the top 10 % of items well over half.
        assert!((10_000..16_000).contains(&counts[0]), "{}", counts[0]);
        let top: u32 = counts[..100].iter().sum();
        assert!(top > 60_000, "{top}");
        assert!(counts.iter().filter(|c| **c > 0).count() > 500);
    }

    #[test]
    fn keys_are_distinct() {
        let keys: std::collections::HashSet<String> = (0..10_000).map(key).collect();
        assert_eq!(keys.len(), 10_000);
        assert_eq!(value(3).len(), 1000);
    }
}
