//! Facts about the machine a result was measured on.

use serde::Serialize;

/// Recorded with every benchmark result.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    /// Online CPUs.
    pub cpus: usize,
    /// CPU model name from /proc/cpuinfo.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Hypervisor, if /proc/cpuinfo says there is one.
    pub virtualized: bool,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// UTC time of the run (seconds since the epoch).
    pub unix_time_s: u64,
    /// The kernel's clock source (`tsc` where a clock read stays in user
    /// space; `kvm-clock`, `hpet` or `acpi_pm` can make each read cost
    /// far more, and every polling loop reads the clock).
    pub clocksource: String,
    /// What one monotonic clock read (`Instant::now`) costs here, ns: the
    /// fastest of a few batches of reads.
    pub clock_read_ns: f64,
}

/// The fastest of five batches of 20,000 `Instant::now` reads, ns per read
/// (a few ms in all).
fn clock_read_ns() -> f64 {
    const READS: u32 = 20_000;
    (0..5)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..READS {
                std::hint::black_box(std::time::Instant::now());
            }
            start.elapsed().as_nanos() as f64 / f64::from(READS)
        })
        .fold(f64::INFINITY, f64::min)
}

impl MachineInfo {
    /// Reads the current machine.
    pub fn current() -> MachineInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let virtualized = cpuinfo.lines().any(|l| l.starts_with("flags") && l.contains(" hypervisor"));
        let kernel =
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0);
        MachineInfo {
            // Online CPUs of the machine (not this thread's affinity mask,
            // which a pinned benchmark narrows to one).
            // SAFETY: sysconf has no preconditions.
            cpus: usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(1),
            cpu_model,
            kernel,
            virtualized,
            memory_bytes,
            unix_time_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            clocksource: std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
            clock_read_ns: clock_read_ns(),
        }
    }

    /// One line for tables.
    pub fn summary(&self) -> String {
        format!(
            "{} x {} ({}), {:.1} GiB, kernel {}, clock {} ({:.0} ns a read)",
            self.cpus,
            self.cpu_model,
            if self.virtualized { "VM" } else { "bare metal" },
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.kernel,
            self.clocksource,
            self.clock_read_ns
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_names_its_clock_and_what_a_read_costs() {
        let m = MachineInfo::current();
        assert!(m.clock_read_ns > 0.0 && m.clock_read_ns < 1_000_000.0, "{}", m.clock_read_ns);
        assert!(!m.clocksource.is_empty());
        let line = m.summary();
        assert!(line.contains(&format!("clock {}", m.clocksource)) && line.contains("ns a read"), "{line}");
    }
}
