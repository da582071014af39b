//! Logical processor counters from procfs and sysfs, one sample per host CPU.
//!
//! `/proc/stat` gives each CPU's busy and guest time, `/proc/interrupts` its device, timer,
//! rescheduling and function-call interrupts, and cpuidle its idle-state entries and residency.
//! [`LpSample::write`] puts a sample into an LP stats page (the caller owns the pages: the
//! hypervisor instance, when it has LP objects).

use std::collections::BTreeMap;
use std::io;

use hvstats::SharedPage;
use hvstats_abi::catalog::lp;

/// 100 ns units per second.
const UNITS_PER_SEC: u64 = 10_000_000;

/// One host CPU's counters at one moment (times in 100 ns).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LpSample {
    /// The CPU number.
    pub cpu: u32,
    /// CLOCK_BOOTTIME.
    pub global_time: u64,
    /// Non-idle time.
    pub total_run_time: u64,
    /// Non-idle time less guest time.
    pub hypervisor_run_time: u64,
    /// Device interrupts (numbered IRQ lines).
    pub hardware_interrupts: u64,
    /// Function-call IPIs received (CAL).
    pub inter_processor_interrupts: u64,
    /// Rescheduling IPIs (RES).
    pub scheduler_interrupts: u64,
    /// Local timer interrupts (LOC).
    pub timer_interrupts: u64,
    /// Entries into any idle state.
    pub halts: u64,
    /// (entries, residency) of the idle states named C1, C2 and C3.
    pub c_states: [(u64, u64); 3],
}

impl LpSample {
    /// Writes the sample into `page` (an LP page).
    pub fn write(&self, page: &SharedPage) {
        page.set(lp::GLOBAL_TIME, self.global_time);
        page.set(lp::TOTAL_RUN_TIME, self.total_run_time);
        page.set(lp::HYPERVISOR_RUN_TIME, self.hypervisor_run_time);
        page.set(lp::HARDWARE_INTERRUPTS, self.hardware_interrupts);
        page.set(lp::INTER_PROCESSOR_INTERRUPTS, self.inter_processor_interrupts);
        page.set(lp::SCHEDULER_INTERRUPTS, self.scheduler_interrupts);
        page.set(lp::TIMER_INTERRUPTS, self.timer_interrupts);
        page.set(lp::PROCESSOR_HALTS, self.halts);
        for (i, (count, time)) in [
            (lp::C1_TRANSITIONS, lp::C1_TIME),
            (lp::C2_TRANSITIONS, lp::C2_TIME),
            (lp::C3_TRANSITIONS, lp::C3_TIME),
        ]
        .into_iter()
        .enumerate()
        {
            page.set(count, self.c_states[i].0);
            page.set(time, self.c_states[i].1);
        }
    }
}

fn user_hz() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

fn boottime_100ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * UNITS_PER_SEC + ts.tv_nsec as u64 / 100
}

/// Parses the `cpuN` lines of `/proc/stat`: CPU → (non-idle, guest) in ticks.
fn parse_stat(text: &str) -> BTreeMap<u32, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(cpu) = f.next().and_then(|n| n.strip_prefix("cpu")).and_then(|n| n.parse().ok()) else {
            continue;
        };
        let v: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
        // included in user and nice.
        let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
        out.insert(cpu, (busy, get(8) + get(9)));
    }
    out
}

/// Parses `/proc/interrupts`: per CPU column, (device, CAL, RES, LOC).
fn parse_interrupts(text: &str) -> Vec<[u64; 4]> {
    let mut lines = text.lines();
    let cpus = lines.next().map(|h| h.split_whitespace().count()).unwrap_or(0);
    let mut out = vec![[0u64; 4]; cpus];
    for line in lines {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let name = name.trim();
        let slot = match name {
            "CAL" => 1,
            "RES" => 2,
            "LOC" => 3,
            n if n.chars().all(|c| c.is_ascii_digit()) => 0,
            _ => continue,
        };
        for (cpu, v) in rest.split_whitespace().take(cpus).enumerate() {
            out[cpu][slot] += v.parse::<u64>().unwrap_or(0);
        }
    }
    out
}

fn read_u64(path: &str) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Idle-state entries and the C1..C3 (entries, residency in 100 ns) of `cpu`.
fn cpuidle(cpu: u32) -> (u64, [(u64, u64); 3]) {
    let mut halts = 0;
    let mut c = [(0, 0); 3];
    for state in 0.. {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpuidle/state{state}");
        let Ok(name) = std::fs::read_to_string(format!("{dir}/name")) else { break };
        let usage = read_u64(&format!("{dir}/usage"));
        let time_us = read_u64(&format!("{dir}/time"));
        halts += usage;
        let idx = match name.trim() {
            "C1" => 0,
            "C2" => 1,
            "C3" => 2,
            _ => continue,
        };
        c[idx] = (usage, time_us * 10);
    }
    (halts, c)
}

/// Reads a sample of every host CPU.
///
/// # Errors
/// When `/proc/stat` or `/proc/interrupts` cannot be read.
pub fn sample() -> io::Result<Vec<LpSample>> {
    let stat = parse_stat(&std::fs::read_to_string("/proc/stat")?);
    let irqs = parse_interrupts(&std::fs::read_to_string("/proc/interrupts")?);
    let unit = UNITS_PER_SEC / user_hz();
    let now = boottime_100ns();
    Ok(stat
        .into_iter()
        .map(|(cpu, (busy, guest))| {
            let i = irqs.get(cpu as usize).copied().unwrap_or_default();
            let (halts, c_states) = cpuidle(cpu);
            LpSample {
                cpu,
                global_time: now,
                total_run_time: busy * unit,
                hypervisor_run_time: busy.saturating_sub(guest) * unit,
                hardware_interrupts: i[0],
                inter_processor_interrupts: i[1],
                scheduler_interrupts: i[2],
                timer_interrupts: i[3],
                halts,
                c_states,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::ObjectKind;

    #[test]
    fn proc_stat_lines_give_busy_and_guest_ticks() {
        let text = "cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 10 20 30 40 50 60 70 80 90 100\ncpu1 1 1 1 1 1 1 1 1 0 0\nintr 5\n";
        let m = parse_stat(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[&0], (10 + 20 + 30 + 60 + 70 + 80, 190));
        assert_eq!(m[&1], (6, 0));
    }

    #[test]
    fn proc_interrupts_columns_are_split_per_cpu() {
        let text = "     CPU0 CPU1\n 24: 1 2 IO-APIC 5-edge x\n 26: 10 20 IO-APIC y\nLOC: 100 200 Local timer\nRES: 3 4 Resched\nCAL: 5 6 Function\nNMI: 9 9 x\n";
        assert_eq!(parse_interrupts(text), vec![[11, 5, 3, 100], [22, 6, 4, 200]]);
    }

    #[test]
    fn this_host_gives_a_sample_per_cpu() {
        let samples = sample().unwrap();
        assert!(!samples.is_empty());
        let s = &samples[0];
        assert!(s.global_time > 0 && s.total_run_time > 0 && s.timer_interrupts > 0, "{s:?}");
        assert!(s.hypervisor_run_time <= s.total_run_time);
        let page = SharedPage::anonymous(ObjectKind::LogicalProcessor).unwrap();
        s.write(&page);
        assert_eq!(page.get(lp::TIMER_INTERRUPTS), s.timer_interrupts);
    }
}
