//! Measurements that survive a noisy machine: every benchmark's compared
//! pairs go through here.
//!
//! On a shared 2-core VM a point can lose a core to other load (a build, a
//! test run, the hypervisor) for part of its window, and a ratio built on
//! such a point says nothing (one `bench spindle` run showed "one active
//! subgroup of 10" at 2.8× a single subgroup because the reference point
//! got 0.87 of its 2 cores). So:
//!
//! - A [`Probe`] measures, over exactly a sample's window, the CPU time this
//!   process got and the time its threads waited on the run queue (from
//!   `/proc/self/task/*/schedstat`). Their ratio is the **core share**:
//!   the fraction of the CPU the process asked for that it got.
//! - A sample whose core share is below [`MIN_CORE_SHARE`] (90 %), having
//!   waited at least [`MIN_WAIT_CORES`], is **contended**: it is measured again (after a pause, so transient load
//!   can pass), and if it stays contended it is kept, flagged, and left out
//!   of every ratio.
//! - Where a benchmark's own processes are meant to fill the cores (a
//!   busy-polling cluster yields to its own threads all the time), their
//!   run-queue wait says nothing about other load: a [`MachineProbe`]
//!   measures instead what the rest of the machine took over the window
//!   (every CPU's busy time and the hypervisor's steal, from `/proc/stat`,
//!   less the group's own CPU time), and such a sample is contended when
//!   that is at least [`MAX_FOREIGN_CORES`].
//! - A compared pair is measured **interleaved**, A B A B …, at least
//!   [`MIN_ROUNDS`] rounds, so slow drift of the machine hits both sides;
//!   each side is reported as median [min–max] of its uncontended samples,
//!   and the ratio as median [min–max] of the per-round ratios of rounds
//!   where both samples were uncontended.
//!
//! # Invariants
//! - Every ratio compares samples of this invocation only.
//! - A contended sample never enters a ratio or a spread; a comparison with
//!   no clean round has no ratio (`None`), never a guess.
//! - `Spread::of` of one value is that value with min = max.

use serde::Serialize;
use std::time::{Duration, Instant};

/// Below this share of the CPU it asked for, a sample is contended...
pub const MIN_CORE_SHARE: f64 = 0.9;
/// ...if it also waited at least this many cores' worth: a mostly idle
/// process (a point that is blocked by design) waits a little after every
/// wake-up, which is not other load taking its CPU.
pub const MIN_WAIT_CORES: f64 = 0.05;
/// A sample whose window lost at least this many cores' worth of CPU to
/// other processes (or to the hypervisor) is contended, where that is
/// measured ([`MachineProbe`]). A quiet VM's own daemons take 0.01-0.015.
pub const MAX_FOREIGN_CORES: f64 = 0.05;
/// Rounds of an interleaved comparison, at least.
pub const MIN_ROUNDS: usize = 3;

/// What a sample's window got from the machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Load {
    /// CPU time this process got (user + system, all threads) over the
    /// window's wall time, in cores.
    pub cpu_cores: f64,
    /// Time its threads were runnable but waiting for a CPU, in cores.
    pub runqueue_wait_cores: f64,
    /// CPU time the rest of the machine took over the window (other
    /// processes, and the hypervisor's steal), in cores, where a
    /// [`MachineProbe`] measured it; then it alone decides contention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreign_cores: Option<f64>,
}

impl Load {
    /// CPU got over CPU asked for (got + waited); 1 when nothing ran.
    pub fn core_share(&self) -> f64 {
        let asked = self.cpu_cores + self.runqueue_wait_cores;
        if asked <= 1e-9 { 1.0 } else { self.cpu_cores / asked }
    }

    /// Of two contended loads, whether this one is less so: less foreign
    /// load where that was measured, else a larger core share.
    pub fn less_contended_than(&self, other: &Load) -> bool {
        match (self.foreign_cores, other.foreign_cores) {
            (Some(mine), Some(theirs)) => mine < theirs,
            _ => self.core_share() > other.core_share(),
        }
    }

    /// Whether other load took at least [`MAX_FOREIGN_CORES`] where that
    /// was measured; otherwise whether the sample got less than
    /// [`MIN_CORE_SHARE`] of what it asked, having waited at least
    /// [`MIN_WAIT_CORES`].
    pub fn contended(&self) -> bool {
        match self.foreign_cores {
            Some(foreign) => foreign >= MAX_FOREIGN_CORES,
            None => self.core_share() < MIN_CORE_SHARE && self.runqueue_wait_cores >= MIN_WAIT_CORES,
        }
    }
}

/// Started at a window's start, read at its end.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    cpu_ns: u64,
    wait_ns: u64,
    at: Instant,
}

impl Probe {
    /// Starts measuring now.
    pub fn start() -> Probe {
        Probe { cpu_ns: process_cpu_ns(), wait_ns: runqueue_wait_ns(), at: Instant::now() }
    }

    /// The load since [`start`](Self::start).
    pub fn stop(&self) -> Load {
        let wall = self.at.elapsed().as_nanos().max(1) as f64;
        Load {
            cpu_cores: process_cpu_ns().saturating_sub(self.cpu_ns) as f64 / wall,
            runqueue_wait_cores: runqueue_wait_ns().saturating_sub(self.wait_ns) as f64 / wall,
            foreign_cores: None,
        }
    }
}

/// A [`Probe`] that also covers other processes (a benchmark's servers):
/// their threads' CPU time and run-queue wait join this process's.
#[derive(Clone, Debug)]
pub struct GroupProbe {
    own: Probe,
    pids: Vec<u32>,
    cpu_ns: u64,
    wait_ns: u64,
}

impl GroupProbe {
    /// Starts measuring this process and `pids` now.
    pub fn start(pids: &[u32]) -> GroupProbe {
        let (cpu_ns, wait_ns) =
            pids.iter().map(|p| schedstat_ns(*p)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        GroupProbe { own: Probe::start(), pids: pids.to_vec(), cpu_ns, wait_ns }
    }

    /// The load of all of them since [`start`](Self::start), in cores.
    pub fn stop(&self) -> Load {
        let wall = self.own.at.elapsed().as_nanos().max(1) as f64;
        let own = self.own.stop();
        let (cpu, wait) =
            self.pids.iter().map(|p| schedstat_ns(*p)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        Load {
            cpu_cores: own.cpu_cores + cpu.saturating_sub(self.cpu_ns) as f64 / wall,
            runqueue_wait_cores: own.runqueue_wait_cores + wait.saturating_sub(self.wait_ns) as f64 / wall,
            foreign_cores: None,
        }
    }
}

/// A [`GroupProbe`] that also measures what the rest of the machine took
/// over the window: the machine's busy time (every CPU's user, nice,
/// system, irq and softirq time, and the steal of the hypervisor) less the
/// group's CPU time. Its [`Load`] is contended on that alone
/// ([`Load::contended`]), so a group that fills the cores by design is not
/// flagged for waiting on itself.
///
/// Limits: `/proc/stat` counts clock ticks (10 ms), so the figure is less
/// [`TICK_ALLOWANCE`] ticks' worth (a 300 ms window of a process spinning
/// alone read 0.037 cores of "other" load without it); and a kernel that
/// samples CPU time at its tick undercounts a group's short bursts (20 µs
/// every 300 µs read 0.04 cores low), which hides as much other load, while
/// one that accounts irq time apart counts the group's own softirq work as
/// other load. Where `/proc/stat` is unreadable the figure is `None` and the
/// core-share rule applies.
#[derive(Clone, Debug)]
pub struct MachineProbe {
    group: GroupProbe,
    machine_ns: Option<u64>,
}

/// Clock ticks of `/proc/stat`'s resolution a [`MachineProbe`] allows
/// before it counts other load.
pub const TICK_ALLOWANCE: u64 = 2;

impl MachineProbe {
    /// Starts measuring this process, `pids` and the machine now.
    pub fn start(pids: &[u32]) -> MachineProbe {
        MachineProbe { machine_ns: machine_busy_ns(), group: GroupProbe::start(pids) }
    }

    /// The group's load since [`start`](Self::start), with the rest of the
    /// machine's in `foreign_cores`.
    pub fn stop(&self) -> Load {
        let wall = self.group.own.at.elapsed().as_nanos().max(1) as f64;
        let load = self.group.stop();
        let foreign = self.machine_ns.zip(machine_busy_ns()).map(|(before, after)| {
            let machine = after.saturating_sub(before) as f64 / wall;
            let allowance = TICK_ALLOWANCE as f64 * clock_tick_ns() as f64 / wall;
            // /proc/stat counts in ticks and the group in ns: a quiet
            // window can read a little below zero.
            (machine - load.cpu_cores - allowance).max(0.0)
        });
        Load { foreign_cores: foreign, ..load }
    }
}

/// Busy time of every CPU since boot, ns: user, nice, system, irq, softirq
/// and steal from the first line of `/proc/stat` (guest time is inside
/// user); `None` where unreadable.
pub fn machine_busy_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next().filter(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = cpu.split_whitespace().skip(1).map(|v| v.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal
    let at = |i: usize| ticks.get(i).copied();
    let busy = at(0)? + at(1)? + at(2)? + at(5)? + at(6)? + at(7)?;
    Some(busy * clock_tick_ns())
}

/// One clock tick (`/proc/stat`'s unit), ns.
fn clock_tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    1_000_000_000 / hz
}

/// Time on a CPU and time waiting for one, summed over the threads of
/// process `pid` alive now, ns (/proc/PID/task/*/schedstat); (0, 0) where
/// unreadable (the process is gone, or the kernel keeps no schedstat).
pub fn schedstat_ns(pid: u32) -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            let mut f = s.split_whitespace().map(|w| w.parse::<u64>().ok());
            Some((f.next()??, f.next()??))
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// User + system CPU time of this process (all threads), ns.
pub fn process_cpu_ns() -> u64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

/// Run-queue wait of every thread of this process so far, ns (the second
/// field of /proc/self/task/*/schedstat); 0 where the kernel has none.
/// Threads alive at both reads count fully; a benchmark's workers are.
pub fn runqueue_wait_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Median and range of some samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many samples.
    pub n: usize,
}

impl Spread {
    /// The spread of `values` (`None` when empty or not all finite).
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Spread { median, min: v[0], max: v[n - 1], n })
    }

    /// `median [min–max]`, each value formatted by `f`.
    pub fn show(&self, f: impl Fn(f64) -> String) -> String {
        format!("{} [{}–{}]", f(self.median), f(self.min), f(self.max))
    }
}

/// One measurement with the load of its window.
#[derive(Clone, Debug, Serialize)]
pub struct Sample<T> {
    /// What was measured.
    pub value: T,
    /// What the window got from the machine.
    pub load: Load,
    /// Measurements taken to get this one (above 1: earlier ones were
    /// contended).
    pub attempts: u32,
}

impl<T> Sample<T> {
    /// Whether it stayed contended after its retries.
    pub fn contended(&self) -> bool {
        self.load.contended()
    }
}

/// How hard to try for an uncontended sample.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    /// Measurements of one sample at most.
    pub attempts: u32,
    /// Pause before measuring again (transient load passes).
    pub pause: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry { attempts: 3, pause: Duration::from_millis(200) }
    }
}

/// Measures until the sample is uncontended, at most `retry.attempts`
/// times; returns the least contended.
pub fn measure_quiet<T>(
    retry: Retry,
    mut measure: impl FnMut() -> Result<(T, Load), String>,
) -> Result<Sample<T>, String> {
    let mut best: Option<Sample<T>> = None;
    for attempt in 1..=retry.attempts.max(1) {
        let (value, load) = measure()?;
        if !load.contended() {
            return Ok(Sample { value, load, attempts: attempt });
        }
        if best.as_ref().is_none_or(|b| load.less_contended_than(&b.load)) {
            best = Some(Sample { value, load, attempts: attempt });
        }
        std::thread::sleep(retry.pause);
    }
    Ok(best.expect("measured at least once"))
}

/// Samples of the two sides of a comparison, round by round.
#[derive(Clone, Debug)]
pub struct Rounds<T> {
    /// Reference side, one sample per round.
    pub reference: Vec<Sample<T>>,
    /// Subject side, one sample per round.
    pub subject: Vec<Sample<T>>,
}

/// Measures `reference` and `subject` interleaved (reference, subject,
/// reference, …), `rounds` rounds (at least [`MIN_ROUNDS`]), each sample
/// retried while contended.
pub fn interleave<T>(
    rounds: usize,
    retry: Retry,
    mut reference: impl FnMut() -> Result<(T, Load), String>,
    mut subject: impl FnMut() -> Result<(T, Load), String>,
) -> Result<Rounds<T>, String> {
    let rounds = rounds.max(MIN_ROUNDS);
    let mut out = Rounds { reference: Vec::with_capacity(rounds), subject: Vec::with_capacity(rounds) };
    for _ in 0..rounds {
        out.reference.push(measure_quiet(retry, &mut reference)?);
        out.subject.push(measure_quiet(retry, &mut subject)?);
    }
    Ok(out)
}

/// A compared pair as reported: each side's spread and the ratio's.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// What is compared (a sentence).
    pub name: String,
    /// The metric and its unit.
    pub metric: String,
    /// The reference side.
    pub reference: String,
    /// The subject side.
    pub subject: String,
    /// The reference's uncontended samples.
    pub reference_spread: Option<Spread>,
    /// The subject's uncontended samples.
    pub subject_spread: Option<Spread>,
    /// subject / reference per clean round: median [min–max].
    pub ratio: Option<Spread>,
    /// subject − reference per clean round, in the metric's unit: median
    /// [min–max] (what a latency overhead is read as).
    pub difference: Option<Spread>,
    /// Rounds measured.
    pub rounds: usize,
    /// Samples (either side) left out because they stayed contended.
    pub contended_samples: usize,
}

impl Comparison {
    /// Summarizes `rounds` by `metric` (see the module docs).
    pub fn of<T>(
        name: &str,
        metric: &str,
        (reference, subject): (&str, &str),
        rounds: &Rounds<T>,
        value: impl Fn(&T) -> Option<f64>,
    ) -> Comparison {
        let clean = |s: &Sample<T>| if s.contended() { None } else { value(&s.value) };
        let side = |v: &[Sample<T>]| Spread::of(&v.iter().filter_map(clean).collect::<Vec<_>>());
        let pairs: Vec<(f64, f64)> = rounds
            .reference
            .iter()
            .zip(&rounds.subject)
            .filter_map(|(r, s)| Some((clean(r)?, clean(s)?)))
            .collect();
        let ratios: Vec<f64> = pairs.iter().filter(|(r, _)| *r > 0.0).map(|(r, s)| s / r).collect();
        let differences: Vec<f64> = pairs.iter().map(|(r, s)| s - r).collect();
        Comparison {
            name: name.into(),
            metric: metric.into(),
            reference: reference.into(),
            subject: subject.into(),
            reference_spread: side(&rounds.reference),
            subject_spread: side(&rounds.subject),
            ratio: Spread::of(&ratios),
            difference: Spread::of(&differences),
            rounds: rounds.reference.len(),
            contended_samples: rounds
                .reference
                .iter()
                .chain(&rounds.subject)
                .filter(|s| s.contended())
                .count(),
        }
    }

    /// `samples` against a `limit` measured once in the same run (a limit
    /// has no rounds of its own): each clean sample's ratio to it. The
    /// limit side counts as contended wherever its sample is, so it takes
    /// the same rounds.
    pub fn against_limit<T>(
        name: &str,
        metric: &str,
        (limit_name, subject): (&str, &str),
        limit: f64,
        samples: &[Sample<T>],
        value: impl Fn(&T) -> Option<f64>,
    ) -> Comparison {
        let rounds = Rounds {
            reference: samples
                .iter()
                .map(|s| Sample { value: Some(limit), load: s.load, attempts: 1 })
                .collect(),
            subject: samples
                .iter()
                .map(|s| Sample { value: value(&s.value), load: s.load, attempts: s.attempts })
                .collect(),
        };
        Comparison::of(name, metric, (limit_name, subject), &rounds, |v| *v)
    }

    /// [`line`](Self::line) followed by the per-round differences,
    /// `({what} median [min–max])`, signed, in `f`'s unit (a latency
    /// overhead, a leader's extra work).
    pub fn line_with_difference(&self, what: &str, f: impl Fn(f64) -> String) -> String {
        let signed = |v: f64| if v >= 0.0 { format!("+{}", f(v)) } else { f(v) };
        let d = self.difference.map_or("-".to_string(), |d| d.show(signed));
        format!("{} ({what} {d})", self.line(&f))
    }

    /// One line: `name: subject / reference = ratio median [min–max] (…)`.
    pub fn line(&self, f: impl Fn(f64) -> String) -> String {
        let side = |s: &Option<Spread>| s.map_or("all contended".to_string(), |s| s.show(&f));
        format!(
            "{}: {} {} vs {} {} → {} ({} rounds{})",
            self.name,
            self.subject,
            side(&self.subject_spread),
            self.reference,
            side(&self.reference_spread),
            self.ratio.map_or("no clean round".to_string(), |r| r.show(|v| format!("{v:.2}×"))),
            self.rounds,
            match self.contended_samples {
                0 => String::new(),
                n => format!(", {n} contended sample(s) left out"),
            }
        )
    }
}

/// Comparisons as CSV (header included).
pub fn comparisons_csv(rows: &[Comparison]) -> String {
    let mut csv = crate::experiment::Csv::new(&[
        "name",
        "metric",
        "reference",
        "subject",
        "reference_median",
        "reference_min",
        "reference_max",
        "subject_median",
        "subject_min",
        "subject_max",
        "ratio_median",
        "ratio_min",
        "ratio_max",
        "difference_median",
        "difference_min",
        "difference_max",
        "clean_rounds",
        "rounds",
        "contended_samples",
    ]);
    let f = |s: Option<Spread>, pick: fn(&Spread) -> f64| crate::experiment::Csv::opt(s.as_ref().map(pick));
    for c in rows {
        csv.row([
            c.name.clone(),
            c.metric.clone(),
            c.reference.clone(),
            c.subject.clone(),
            f(c.reference_spread, |s| s.median),
            f(c.reference_spread, |s| s.min),
            f(c.reference_spread, |s| s.max),
            f(c.subject_spread, |s| s.median),
            f(c.subject_spread, |s| s.min),
            f(c.subject_spread, |s| s.max),
            f(c.ratio, |s| s.median),
            f(c.ratio, |s| s.min),
            f(c.ratio, |s| s.max),
            f(c.difference, |s| s.median),
            f(c.difference, |s| s.min),
            f(c.difference, |s| s.max),
            c.difference.map_or(0, |r| r.n).to_string(),
            c.rounds.to_string(),
            c.contended_samples.to_string(),
        ]);
    }
    csv.text().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(share: f64) -> Load {
        Load { cpu_cores: 2.0 * share, runqueue_wait_cores: 2.0 * (1.0 - share), foreign_cores: None }
    }

    #[test]
    fn spread_is_median_and_range() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn core_share_flags_a_window_that_waited_for_the_cpu() {
        assert!(!load(1.0).contended());
        assert!(!load(0.95).contended());
        assert!(load(0.87).contended());
        assert_eq!(Load::default().core_share(), 1.0, "an idle window is not contended");
        let idle = Load { cpu_cores: 0.08, runqueue_wait_cores: 0.012, foreign_cores: None };
        assert!(idle.core_share() < MIN_CORE_SHARE && !idle.contended(), "wake-up waits of an idle point");
    }

    #[test]
    fn contended_samples_are_retried_then_left_out_of_ratios() {
        // The reference is contended on its first try of round 2 only; the
        // subject stays contended in round 3.
        let mut r_calls = 0;
        let mut s_calls = 0;
        let retry = Retry { attempts: 2, pause: Duration::ZERO };
        let rounds = interleave(
            3,
            retry,
            || {
                r_calls += 1;
                Ok((10.0, if r_calls == 2 { load(0.5) } else { load(1.0) }))
            },
            || {
                s_calls += 1;
                Ok((
                    if s_calls >= 3 { 1000.0 } else { 20.0 },
                    if s_calls >= 3 { load(0.6) } else { load(1.0) },
                ))
            },
        )
        .unwrap();
        assert_eq!(r_calls, 4, "the contended reference sample was measured again");
        assert_eq!(rounds.reference[1].attempts, 2);
        assert_eq!(s_calls, 4, "the subject's last round: two contended tries");
        assert!(rounds.subject[2].contended());
        let c = Comparison::of("t", "x", ("r", "s"), &rounds, |v: &f64| Some(*v));
        assert_eq!(c.contended_samples, 1);
        let ratio = c.ratio.unwrap();
        assert_eq!((ratio.median, ratio.min, ratio.max, ratio.n), (2.0, 2.0, 2.0, 2), "1000 left out");
        assert_eq!(c.subject_spread.unwrap().max, 20.0);
        let d = c.difference.unwrap();
        assert_eq!((d.median, d.min, d.max, d.n), (10.0, 10.0, 10.0, 2), "subject − reference, clean rounds");
        assert!(c.line(|v| format!("{v}")).contains("1 contended sample(s) left out"));
        let with = c.line_with_difference("extra", |v| format!("{v}"));
        assert!(with.ends_with("(extra +10 [+10–+10])"), "{with}");
    }

    #[test]
    fn where_foreign_load_is_measured_it_alone_decides_contention() {
        // A busy group that waits on itself (share 0.5) is clean while the
        // rest of the machine is quiet...
        let own = Load { foreign_cores: Some(0.01), ..load(0.5) };
        assert!(!own.contended(), "a group filling the cores by design");
        // ...and contended once others take a twentieth of a core, however
        // well the group itself did.
        let other = Load { foreign_cores: Some(MAX_FOREIGN_CORES), ..load(1.0) };
        assert!(other.contended());
        assert!(load(0.5).contended(), "unmeasured: the share rule");
    }

    #[test]
    fn a_retry_keeps_the_clean_sample_however_it_shared_the_cores() {
        // A busy group waits on itself (share 0.5) when clean; the first
        // try had a better share but other load took a fifth of a core.
        let loads =
            [Load { foreign_cores: Some(0.2), ..load(0.95) }, Load { foreign_cores: Some(0.0), ..load(0.5) }];
        let mut tries = loads.iter();
        let retry = Retry { attempts: 3, pause: Duration::ZERO };
        let s = measure_quiet(retry, || Ok(((), *tries.next().unwrap()))).unwrap();
        assert_eq!((s.attempts, s.contended()), (2, false));
        // All contended: the least foreign load wins, not the best share.
        let loads =
            [Load { foreign_cores: Some(0.1), ..load(0.5) }, Load { foreign_cores: Some(0.3), ..load(1.0) }];
        let mut tries = loads.iter();
        let retry = Retry { attempts: 2, pause: Duration::ZERO };
        let s = measure_quiet(retry, || Ok(((), *tries.next().unwrap()))).unwrap();
        assert_eq!(s.attempts, 1);
    }

    /// Spins this thread for `d`.
    fn spin_for(d: Duration) {
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < d {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    /// Held by the tests that spin a child process: another test's child
    /// is foreign load to a machine probe.
    static CHILDREN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_machine_probe_counts_another_process_as_foreign_and_itself_not() {
        let _alone = CHILDREN.lock().unwrap_or_else(|e| e.into_inner());
        // This process spinning is the group's own load...
        let p = MachineProbe::start(&[]);
        spin_for(Duration::from_millis(300));
        let own = p.stop();
        assert!(own.cpu_cores > 0.3, "{own:?}");
        // ...a child spinning outside the group is foreign.
        let p = MachineProbe::start(&[]);
        let mut child = std::process::Command::new("timeout")
            .args(["1", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("timeout and sh");
        child.wait().expect("child");
        let foreign = p.stop();
        assert!(
            foreign.foreign_cores.unwrap() > own.foreign_cores.unwrap() + 0.2 && foreign.contended(),
            "a spinning child: {foreign:?}, this process spinning: {own:?}"
        );
    }

    #[test]
    fn a_limit_comparison_divides_each_clean_sample_by_the_limit() {
        let samples = vec![
            Sample { value: 30.0, load: load(1.0), attempts: 1 },
            Sample { value: 10.0, load: load(0.5), attempts: 3 },
            Sample { value: 20.0, load: load(1.0), attempts: 1 },
        ];
        let c = Comparison::against_limit("t", "GB/s", ("ring", "x"), 10.0, &samples, |v| Some(*v));
        let r = c.ratio.unwrap();
        assert_eq!((r.median, r.min, r.max, r.n), (2.5, 2.0, 3.0, 2), "the contended sample left out");
        assert_eq!(c.reference_spread.unwrap().median, 10.0);
        assert_eq!(c.contended_samples, 2, "the limit side follows its sample's load");
    }

    #[test]
    fn a_comparison_without_a_clean_round_has_no_ratio() {
        let rounds = interleave(
            3,
            Retry { attempts: 1, pause: Duration::ZERO },
            || Ok((1.0, load(0.5))),
            || Ok((2.0, load(1.0))),
        )
        .unwrap();
        let c = Comparison::of("t", "x", ("r", "s"), &rounds, |v: &f64| Some(*v));
        assert_eq!(c.ratio, None);
        assert_eq!(c.reference_spread, None);
        assert_eq!(c.subject_spread.unwrap().n, 3);
        assert_eq!(c.rounds, MIN_ROUNDS);
    }

    #[test]
    fn the_probe_sees_this_process_use_a_core() {
        let p = Probe::start();
        spin_for(Duration::from_millis(50));
        let l = p.stop();
        assert!(l.cpu_cores > 0.3, "a spinning thread used {l:?}");
    }

    /// A group probe counts a child process's CPU beside this one's: over
    /// the same window it sees a spinning child's core more than a probe
    /// of this process alone (whose other test threads both count).
    #[test]
    fn the_group_probe_sees_a_child_process_use_a_core() {
        let _alone = CHILDREN.lock().unwrap_or_else(|e| e.into_inner());
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("sh");
        let own = Probe::start();
        let group = GroupProbe::start(&[child.id()]);
        std::thread::sleep(Duration::from_millis(300));
        let (g, o) = (group.stop(), own.stop());
        let _ = child.kill();
        let _ = child.wait();
        assert!(g.cpu_cores - o.cpu_cores > 0.3, "with the child {g:?}, this process alone {o:?}");
    }
}
