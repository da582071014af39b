//! Logical processors: which host CPUs an instance has LP objects for, and the collector that
//! fills their pages from procfs and sysfs.
//!
//! Each online host CPU is one logical processor object (seed 001: "the number of logical
//! processor objects matches the number of logical processors in the computer"). LP index `n` is
//! the `n`-th online CPU.
//!
//! Sources (the catalog's "maintained" notes say the same): `/proc/stat` per-CPU times (total run
//! time = user + nice + system + irq + softirq; hypervisor run time = that less guest and
//! guest_nice time), `/proc/interrupts` (device IRQ lines → hardware interrupts, LOC → timer,
//! RES → scheduler, CAL → inter-processor interrupts), cpuidle (entries into every state →
//! processor halts; the states named C1, C2 and C3 → their transitions and time), and
//! CLOCK_BOOTTIME for global time. The parsers are pure functions over the files' text.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use hvstats_abi::CounterId;
use hvstats_abi::catalog::lp;

use crate::page::SharedPage;

/// The online host CPUs, from `/sys/devices/system/cpu/online`, or `0..available_parallelism`
/// when that file cannot be read.
pub fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s).ok())
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as u32).collect()
        })
}

/// Parses a kernel CPU list such as `0-3,5,8-9`.
///
/// # Errors
/// `InvalidData` on anything else.
pub fn parse_cpu_list(text: &str) -> io::Result<Vec<u32>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("not a CPU list: {text:?}"));
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 1 << 16 {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(cpus)
}

/// One `cpuN` line of `/proc/stat`, in clock ticks (USER_HZ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// N of the `cpuN` line: the host CPU number, as sysfs and `/proc/interrupts` number it.
    pub cpu: u32,
    /// user (guest time included).
    pub user: u64,
    /// nice (guest_nice time included).
    pub nice: u64,
    /// Ticks in kernel mode (irq and softirq time apart).
    pub system: u64,
    /// Ticks in the idle task; not busy (see [`busy`](Self::busy)).
    pub idle: u64,
    /// Ticks idle while waiting for I/O; not busy, and approximate by the kernel's own account.
    pub iowait: u64,
    /// Ticks servicing hardware interrupts.
    pub irq: u64,
    /// Ticks servicing softirqs.
    pub softirq: u64,
    /// Ticks a hypervisor beneath this host gave to others; not busy; 0 on bare metal.
    pub steal: u64,
    /// Ticks running guest vCPUs (also counted in `user`); 0 on kernels without the field.
    pub guest: u64,
    /// Ticks running niced guest vCPUs (also counted in `nice`); 0 on kernels without the field.
    pub guest_nice: u64,
}

impl CpuTimes {
    /// Ticks the CPU was not idle (neither idle, nor waiting for I/O, nor stolen).
    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq
    }

    /// Busy ticks not spent running guests: what LP "Hypervisor run time" is made of.
    pub(crate) fn busy_outside_guests(&self) -> u64 {
        self.busy().saturating_sub(self.guest + self.guest_nice)
    }
}

/// The per-CPU lines of `/proc/stat` (the aggregate `cpu` line is skipped; missing trailing
/// fields of older kernels read 0; malformed lines are skipped).
pub(crate) fn parse_proc_stat(text: &str) -> Vec<CpuTimes> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let cpu = fields.next()?.strip_prefix("cpu")?.parse().ok()?;
            let mut v = [0u64; 10];
            for (slot, field) in v.iter_mut().zip(fields) {
                *slot = field.parse().ok()?;
            }
            let [user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice] = v;
            Some(CpuTimes { cpu, user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice })
        })
        .collect()
}

/// The interrupts one CPU received, from `/proc/interrupts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuInterrupts {
    /// Numbered (device) IRQ lines.
    pub device: u64,
    /// LOC: local timer interrupts.
    pub local_timer: u64,
    /// RES: rescheduling interrupts.
    pub rescheduling: u64,
    /// CAL: function call interrupts (IPIs).
    pub function_call: u64,
}

/// Per-CPU interrupt counts from `/proc/interrupts`, by CPU number (from the `CPUn` header).
pub(crate) fn parse_proc_interrupts(text: &str) -> BTreeMap<u32, CpuInterrupts> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return BTreeMap::new() };
    let cpus: Vec<u32> =
        header.split_ascii_whitespace().filter_map(|c| c.strip_prefix("CPU")?.parse().ok()).collect();
    let mut counts: BTreeMap<u32, CpuInterrupts> =
        cpus.iter().map(|&c| (c, CpuInterrupts::default())).collect();
    for line in lines {
        let Some((label, rest)) = line.split_once(':') else { continue };
        let label = label.trim();
        let slot: fn(&mut CpuInterrupts) -> &mut u64 = match label {
            "LOC" => |c| &mut c.local_timer,
            "RES" => |c| &mut c.rescheduling,
            "CAL" => |c| &mut c.function_call,
            l if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) => |c| &mut c.device,
            _ => continue,
        };
        // Columns follow the header's CPU order; a row may stop early (ERR, MIS have one value).
        for (cpu, field) in cpus.iter().zip(rest.split_ascii_whitespace()) {
            let Ok(n) = field.parse::<u64>() else { break };
            if let Some(c) = counts.get_mut(cpu) {
                *slot(c) += n;
            }
        }
    }
    counts
}

/// One cpuidle state of a CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleState {
    /// The state's name (`POLL`, `C1`, …).
    pub name: String,
    /// The state's `usage` file: entries since boot, summed into LP "Processor halts/sec".
    pub usage: u64,
    /// Time spent in it, in microseconds.
    pub time_us: u64,
}

/// The cpuidle states of `cpu` under `sysfs_cpu` (`/sys/devices/system/cpu`); none when the
/// CPU has no cpuidle driver.
pub fn read_idle_states(sysfs_cpu: &Path, cpu: u32) -> Vec<IdleState> {
    let mut buf = Vec::new();
    hold_idle_states(sysfs_cpu, cpu, &mut 0)
        .iter()
        .filter_map(|state| read_idle_state(state, &mut buf))
        .collect()
}

/// What the collector knows of one CPU at one moment.
#[derive(Clone, Debug, Default)]
pub struct LpSample {
    /// CLOCK_BOOTTIME in 100 ns.
    pub global_time_100ns: u64,
    /// `/proc/stat` times, if the CPU has a line.
    pub times: Option<CpuTimes>,
    /// Clock ticks per second of those times.
    pub ticks_per_second: u64,
    /// `/proc/interrupts` counts, if the CPU has a column.
    pub interrupts: Option<CpuInterrupts>,
    /// The CPU's cpuidle states in sysfs `stateN` order; empty without a cpuidle driver.
    pub idle: Vec<IdleState>,
}

/// The next value of a time counter of one processor: the source's reading `raw`, but never
/// behind the value it had (`previous`) and never ahead of it by more than the `elapsed` time since
/// it was written; nor ahead of `now` on a first write (one processor cannot be busy for longer
/// than the clock ran). So a reader never sees a processor busy for more than 100 % of an
/// interval, whatever the tick rounding of `/proc/stat` or sysfs; time held back is caught up
/// when the processor is less busy.
pub fn bounded_time(raw: u64, previous: u64, elapsed: u64, first: bool, now: u64) -> u64 {
    let ceiling = if first { now } else { previous.saturating_add(elapsed) };
    raw.min(ceiling).max(if first { 0 } else { previous })
}

/// Writes `sample` into an LP page (the collector is the page's only writer).
///
/// Time counters advance by at most the global time that passed since the previous write
/// ([`bounded_time`]).
pub fn apply(page: &SharedPage, sample: &LpSample) {
    let previous_time = page.get(lp::GLOBAL_TIME);
    let now = sample.global_time_100ns.max(previous_time);
    let first = previous_time == 0;
    let elapsed = now - previous_time;
    let set_time = |id, raw: u64| page.set(id, bounded_time(raw, page.get(id), elapsed, first, now));
    page.set(lp::GLOBAL_TIME, now);
    if let Some(t) = &sample.times {
        let to_100ns = |ticks: u64| match sample.ticks_per_second {
            0 => 0,
            hz => u64::try_from(u128::from(ticks) * 10_000_000 / u128::from(hz)).unwrap_or(u64::MAX),
        };
        set_time(lp::TOTAL_RUN_TIME, to_100ns(t.busy()));
        set_time(
            lp::HYPERVISOR_RUN_TIME,
            to_100ns(t.busy_outside_guests()).min(page.get(lp::TOTAL_RUN_TIME)),
        );
    }
    if let Some(i) = &sample.interrupts {
        page.set(lp::HARDWARE_INTERRUPTS, i.device);
        page.set(lp::TIMER_INTERRUPTS, i.local_timer);
        page.set(lp::SCHEDULER_INTERRUPTS, i.rescheduling);
        page.set(lp::INTER_PROCESSOR_INTERRUPTS, i.function_call);
    }
    page.set(lp::PROCESSOR_HALTS, sample.idle.iter().map(|s| s.usage).sum());
    for (name, transitions, time) in C_STATES {
        let state = sample.idle.iter().find(|s| s.name == name);
        page.set(transitions, state.map_or(0, |s| s.usage));
        set_time(time, state.map_or(0, |s| s.time_us.saturating_mul(10)));
    }
}

/// The cpuidle states the catalog has rows for: the state's name, its transitions and its time.
const C_STATES: [(&str, CounterId, CounterId); 3] = [
    ("C1", lp::C1_TRANSITIONS, lp::C1_TIME),
    ("C2", lp::C2_TRANSITIONS, lp::C2_TIME),
    ("C3", lp::C3_TRANSITIONS, lp::C3_TIME),
];

/// The LP counters no source gives for a CPU whose cpuidle states are `idle`: the catalog's
/// unmaintained rows (context switches, IPIs sent, …), the rows of the C-states the CPU does not
/// have (a guest's `haltpoll` driver has `POLL` and `haltpoll idle`, no C1), and its halts when it
/// has no cpuidle driver. Declared unavailable, readers show them as unknown ("-", null, no
/// series), never as a measured 0.
pub(crate) fn unavailable(idle: &[IdleState]) -> Vec<CounterId> {
    let mut out: Vec<CounterId> =
        hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::LogicalProcessor)
            .filter(|c| !c.maintained.is_maintained())
            .map(|c| c.id)
            .collect();
    for (name, transitions, time) in C_STATES {
        if !idle.iter().any(|s| s.name == name) {
            out.extend([transitions, time]);
        }
    }
    if idle.is_empty() {
        out.push(lp::PROCESSOR_HALTS);
    }
    out
}

/// [`unavailable`] for host CPU `cpu`, from its cpuidle states in sysfs.
pub(crate) fn unavailable_on_host(cpu: u32) -> Vec<CounterId> {
    unavailable(&read_idle_states(Path::new("/sys/devices/system/cpu"), cpu))
}

/// The LP counters `sample` gives nothing for: those [`unavailable`] names for its idle states,
/// the run times without a `/proc/stat` line, the interrupts without a `/proc/interrupts`
/// column. A reader shows them absent, never as a measured 0.
pub fn unmeasured(sample: &LpSample) -> Vec<CounterId> {
    let mut out = unavailable(&sample.idle);
    if sample.times.is_none() {
        out.extend([lp::TOTAL_RUN_TIME, lp::HYPERVISOR_RUN_TIME]);
    }
    if sample.interrupts.is_none() {
        out.extend([
            lp::HARDWARE_INTERRUPTS,
            lp::TIMER_INTERRUPTS,
            lp::SCHEDULER_INTERRUPTS,
            lp::INTER_PROCESSOR_INTERRUPTS,
        ]);
    }
    out
}

/// CLOCK_BOOTTIME in 100 ns units.
pub(crate) fn boot_time_100ns() -> u64 {
    hvstats_host::os::clock_time(libc::CLOCK_BOOTTIME)
        .map_or(0, |t| u64::try_from(t.as_nanos() / 100).unwrap_or(u64::MAX))
}

/// Samples every CPU in `cpus` from the host's procfs and sysfs, opening each file anew.
///
/// # Errors
/// When `/proc/stat` or `/proc/interrupts` cannot be read.
#[cfg(test)]
pub(crate) fn sample_host(cpus: &[u32]) -> io::Result<Vec<LpSample>> {
    HostFiles::default().sample(cpus)
}

/// Samples taken between two listings of the CPUs' cpuidle states: a driver registered later
/// (a module loaded) shows its states within this many samples; one that goes away shows at
/// once (its files fail to read).
const IDLE_RELIST: u32 = 64;

/// The host's files an LP sample reads, held open between samples and read again from offset 0
/// (procfs and sysfs make a file's text anew at each read from its start), with one buffer: a
/// refresh opens no file and allocates no text, whatever the number of CPUs and idle states.
#[derive(Debug, Default)]
pub(crate) struct HostFiles {
    stat: Option<File>,
    interrupts: Option<File>,
    /// By CPU, its cpuidle states as last listed (`None`: not listed yet, or a read failed).
    idle: BTreeMap<u32, Option<Vec<HeldIdleState>>>,
    samples: u32,
    text: Vec<u8>,
}

/// cpuidle files held open at most (two a state): a host of 768 CPUs with 6 states each has
/// 9,216, which would take the descriptors VMs are counted with; the states past this are read by
/// path at each sample.
const IDLE_FILES_HELD: usize = 2048;

/// One cpuidle state's name, its directory, and its `usage` and `time` files when held.
#[derive(Debug)]
struct HeldIdleState {
    name: String,
    dir: std::path::PathBuf,
    files: Option<(File, File)>,
}

impl HostFiles {
    /// Samples every CPU in `cpus`.
    ///
    /// # Errors
    /// When `/proc/stat` or `/proc/interrupts` cannot be read.
    pub(crate) fn sample(&mut self, cpus: &[u32]) -> io::Result<Vec<LpSample>> {
        let stat = parse_proc_stat(read_held(&mut self.stat, "/proc/stat", &mut self.text)?);
        let interrupts =
            parse_proc_interrupts(read_held(&mut self.interrupts, "/proc/interrupts", &mut self.text)?);
        let now = boot_time_100ns();
        let hz = hvstats_host::task_stat::ticks_per_second();
        self.samples = self.samples.wrapping_add(1);
        if self.samples.is_multiple_of(IDLE_RELIST) {
            self.idle.clear();
        }
        let sysfs = Path::new("/sys/devices/system/cpu");
        let mut out = Vec::with_capacity(cpus.len());
        let mut room = IDLE_FILES_HELD.saturating_sub(self.idle_files_held());
        for &cpu in cpus {
            let held = self.idle.entry(cpu).or_default();
            let states = held.get_or_insert_with(|| hold_idle_states(sysfs, cpu, &mut room));
            let idle = read_held_idle_states(states, &mut self.text);
            if idle.is_none() {
                // A state gone (its driver unregistered): listed again at the next sample.
                *held = None;
            }
            out.push(LpSample {
                global_time_100ns: now,
                times: stat.iter().find(|t| t.cpu == cpu).copied(),
                ticks_per_second: hz,
                interrupts: interrupts.get(&cpu).copied(),
                idle: idle.unwrap_or_else(|| read_idle_states(sysfs, cpu)),
            });
        }
        Ok(out)
    }

    /// cpuidle files held open now.
    fn idle_files_held(&self) -> usize {
        let states = self.idle.values().flatten().flatten();
        2 * states.filter(|s| s.files.is_some()).count()
    }
}

/// The text of the file at `path`, read from offset 0 through `held` (opened on first use, and
/// again after a failed read) into `buf`.
fn read_held<'a>(held: &mut Option<File>, path: &str, buf: &'a mut Vec<u8>) -> io::Result<&'a str> {
    let file = match held {
        Some(file) => file,
        None => held.insert(File::open(path)?),
    };
    let text = match read_from_start(file, buf) {
        Ok(text) => text,
        Err(e) => {
            *held = None;
            return Err(e);
        }
    };
    std::str::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

/// Reads all of `file` from offset 0 into `buf`, and gives what was read: the front of `buf`.
/// `buf` only grows, and only its growth is zeroed: one buffer serves `/proc/interrupts` (a
/// megabyte on a host of hundreds of CPUs) and thousands of cpuidle files of a few bytes each,
/// which must not clear the megabyte each time.
fn read_from_start<'a>(file: &File, buf: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
    let mut len = 0;
    loop {
        if buf.len() - len < 4096 {
            buf.resize((2 * buf.len()).max(4096), 0);
        }
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => return Ok(&buf[..len]),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The cpuidle states of `cpu`, in `stateN` order, with their counters' files held open while
/// `room` (files) allows; none when the CPU has no cpuidle driver.
fn hold_idle_states(sysfs_cpu: &Path, cpu: u32, room: &mut usize) -> Vec<HeldIdleState> {
    let dir = sysfs_cpu.join(format!("cpu{cpu}")).join("cpuidle");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("state"))
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|state| {
            let p = dir.join(state);
            let name = std::fs::read_to_string(p.join("name")).ok()?.trim().to_owned();
            let files = if *room >= 2 {
                Some((File::open(p.join("usage")).ok()?, File::open(p.join("time")).ok()?))
            } else {
                None
            };
            *room -= if files.is_some() { 2 } else { 0 };
            Some(HeldIdleState { name, dir: p, files })
        })
        .collect()
}

/// The states of `held` read now; `None` when one cannot be read or parsed.
fn read_held_idle_states(held: &[HeldIdleState], buf: &mut Vec<u8>) -> Option<Vec<IdleState>> {
    held.iter().map(|state| read_idle_state(state, buf)).collect()
}

/// One state's counters read now, through its held files or else by path; `None` when one cannot
/// be read or parsed.
fn read_idle_state(state: &HeldIdleState, buf: &mut Vec<u8>) -> Option<IdleState> {
    let mut number = |held: Option<&File>, name: &str| -> Option<u64> {
        let text = match held {
            Some(file) => read_from_start(file, buf).ok()?,
            None => read_from_start(&File::open(state.dir.join(name)).ok()?, buf).ok()?,
        };
        std::str::from_utf8(text).ok()?.trim().parse().ok()
    };
    let (usage, time) = state.files.as_ref().map(|(u, t)| (u, t)).unzip();
    Some(IdleState {
        name: state.name.clone(),
        usage: number(usage, "usage")?,
        time_us: number(time, "time")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::ObjectKind;

    const PROC_STAT: &str = "cpu  60190 25785 16491 112911 2345 0 116 940 0 0
cpu0 29787 9848 7728 61208 307 0 13 446 1000 200
cpu1 30402 15936 8763 51702 2037 5 102 494 0 0
intr 1234 0 0
ctxt 99
cpu7 1 2 3
";

    const PROC_INTERRUPTS: &str = "           CPU0       CPU1       
  0:         10          0   IO-APIC   2-edge      timer
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 26:          0         15  IO-APIC   4-edge      ttyS0
NMI:          0          0   Non-maskable interrupts
LOC:     151840     165343   Local timer interrupts
RES:      21262      19129   Rescheduling interrupts
CAL:      91028      81402   Function call interrupts
TLB:      56707      51905   TLB shootdowns
ERR:          0
MIS:          0
";

    #[test]
    fn proc_stat_per_cpu_lines() {
        let cpus = parse_proc_stat(PROC_STAT);
        assert_eq!(cpus.len(), 3);
        assert_eq!(cpus[0].cpu, 0);
        assert_eq!(cpus[0].guest, 1000);
        assert_eq!(cpus[0].busy(), 29787 + 9848 + 7728 + 13);
        assert_eq!(cpus[0].busy_outside_guests(), 29787 + 9848 + 7728 + 13 - 1200);
        assert_eq!(cpus[1].irq, 5);
        // An older kernel's short line: missing fields read 0.
        assert_eq!(cpus[2], CpuTimes { cpu: 7, user: 1, nice: 2, system: 3, ..Default::default() });
    }

    #[test]
    fn proc_interrupts_by_cpu_column() {
        let irqs = parse_proc_interrupts(PROC_INTERRUPTS);
        assert_eq!(
            irqs[&0],
            CpuInterrupts { device: 11, local_timer: 151840, rescheduling: 21262, function_call: 91028 }
        );
        assert_eq!(
            irqs[&1],
            CpuInterrupts { device: 15, local_timer: 165343, rescheduling: 19129, function_call: 81402 }
        );
    }

    #[test]
    fn a_sample_lands_in_the_catalog_counters() {
        let page = SharedPage::anonymous(ObjectKind::LogicalProcessor).unwrap();
        let sample = LpSample {
            global_time_100ns: 10_000_000_000_000,
            times: Some(parse_proc_stat(PROC_STAT)[0]),
            ticks_per_second: 100,
            interrupts: Some(parse_proc_interrupts(PROC_INTERRUPTS)[&0]),
            idle: vec![
                IdleState { name: "POLL".into(), usage: 3, time_us: 1 },
                IdleState { name: "C1".into(), usage: 40, time_us: 7 },
            ],
        };
        apply(&page, &sample);
        assert_eq!(page.get(lp::GLOBAL_TIME), 10_000_000_000_000);
        assert_eq!(page.get(lp::TOTAL_RUN_TIME), (29787 + 9848 + 7728 + 13) * 100_000);
        assert_eq!(page.get(lp::HYPERVISOR_RUN_TIME), (29787 + 9848 + 7728 + 13 - 1200) * 100_000);
        assert_eq!(page.get(lp::HARDWARE_INTERRUPTS), 11);
        assert_eq!(page.get(lp::TIMER_INTERRUPTS), 151840);
        assert_eq!(page.get(lp::SCHEDULER_INTERRUPTS), 21262);
        assert_eq!(page.get(lp::INTER_PROCESSOR_INTERRUPTS), 91028);
        assert_eq!(page.get(lp::PROCESSOR_HALTS), 43);
        assert_eq!(page.get(lp::C1_TRANSITIONS), 40);
        assert_eq!(page.get(lp::C1_TIME), 70);
        assert_eq!(page.get(lp::C2_TRANSITIONS), 0);
    }

    #[test]
    fn lp_busy_never_exceeds_100_percent_of_the_global_time_between_writes() {
        // USER_HZ ticks round: a fully busy CPU sampled every 15 ms shows 1 or 2 ticks (10 or
        // 20 ms) per sample, so the raw busy time runs ahead of the clock on every other sample.
        let page = SharedPage::anonymous(ObjectKind::LogicalProcessor).unwrap();
        let start = 1_000_000_000u64;
        let mut times = CpuTimes { cpu: 0, user: 0, ..Default::default() };
        let (mut last_time, mut last_busy) = (0u64, 0u64);
        let mut over = 0;
        for i in 0..200u64 {
            let now = start + i * 150_000; // 15 ms in 100 ns
            times.user = (now - start).div_ceil(100_000) + 1; // ahead of the clock, rounded up
            let raw = times.user * 100_000;
            apply(
                &page,
                &LpSample {
                    global_time_100ns: now,
                    times: Some(times),
                    ticks_per_second: 100,
                    ..Default::default()
                },
            );
            let (t, busy) = (page.get(lp::GLOBAL_TIME), page.get(lp::TOTAL_RUN_TIME));
            assert!(busy >= last_busy, "run time went backwards");
            if i > 0 {
                assert!(
                    busy - last_busy <= t - last_time,
                    "sample {i}: {} busy in {}",
                    busy - last_busy,
                    t - last_time
                );
                over += u32::from(raw - last_busy > t - last_time);
            }
            assert!(page.get(lp::HYPERVISOR_RUN_TIME) <= busy);
            (last_time, last_busy) = (t, busy);
        }
        assert!(over > 0, "the raw times did run ahead of the clock");
        // Once the processor idles, the time held back is caught up.
        let now = start + 300 * 150_000;
        apply(
            &page,
            &LpSample {
                global_time_100ns: now,
                times: Some(times),
                ticks_per_second: 100,
                ..Default::default()
            },
        );
        assert_eq!(page.get(lp::TOTAL_RUN_TIME), times.user * 100_000);
    }

    #[test]
    fn counters_nothing_collects_are_unavailable_not_zero() {
        let idle = |names: &[&str]| -> Vec<IdleState> {
            names.iter().map(|n| IdleState { name: (*n).into(), usage: 1, time_us: 1 }).collect()
        };
        // A CPU with POLL and C1: the unmaintained rows and C2/C3.
        let missing = unavailable(&idle(&["POLL", "C1"]));
        for id in [lp::CONTEXT_SWITCHES, lp::IPIS_SENT, lp::MONITOR_TRANSITION_COST, lp::CONTEXT_SWITCH_TIME]
        {
            assert!(missing.contains(&id), "{:?}", id.counter().map(|c| c.name));
        }
        for id in [lp::C2_TRANSITIONS, lp::C2_TIME, lp::C3_TRANSITIONS, lp::C3_TIME] {
            assert!(missing.contains(&id));
        }
        for id in
            [lp::C1_TRANSITIONS, lp::C1_TIME, lp::PROCESSOR_HALTS, lp::TIMER_INTERRUPTS, lp::GLOBAL_TIME]
        {
            assert!(!missing.contains(&id));
        }
        // A guest's CPU (haltpoll, no C-states), and one without a cpuidle driver.
        let missing = unavailable(&idle(&["POLL", "haltpoll idle"]));
        assert!(missing.contains(&lp::C1_TIME) && !missing.contains(&lp::PROCESSOR_HALTS));
        assert!(unavailable(&[]).contains(&lp::PROCESSOR_HALTS));
    }

    #[test]
    fn bounded_time_holds_back_and_never_goes_backwards() {
        assert_eq!(bounded_time(500, 0, 0, true, 100), 100, "not more than the clock on a first write");
        assert_eq!(bounded_time(500, 100, 50, false, 0), 150);
        assert_eq!(bounded_time(120, 100, 50, false, 0), 120);
        assert_eq!(bounded_time(90, 100, 50, false, 0), 100, "never backwards");
        assert_eq!(bounded_time(u64::MAX, u64::MAX - 1, u64::MAX, false, 0), u64::MAX);
    }

    #[test]
    fn this_hosts_cpus_can_be_sampled() {
        let cpus = online_cpus();
        let samples = sample_host(&cpus).unwrap();
        assert_eq!(samples.len(), cpus.len());
        assert!(samples[0].times.is_some_and(|t| t.busy() + t.idle > 0));
        assert!(samples[0].global_time_100ns > 0);
    }

    #[test]
    fn held_files_are_read_anew_from_their_start_at_each_sample() {
        let cpus = online_cpus();
        let mut files = HostFiles::default();
        let total = |samples: &[LpSample]| -> u64 {
            samples.iter().filter_map(|s| s.times).map(|t| t.busy() + t.idle).sum()
        };
        let first = files.sample(&cpus).unwrap();
        // Time every CPU is busy or idle for moves with the clock: 2 ticks of 100 a second.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while total(&files.sample(&cpus).unwrap()) < total(&first) + 2 {
            assert!(std::time::Instant::now() < deadline, "the held /proc/stat never moved");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(files.stat.is_some() && files.interrupts.is_some(), "held between samples");
        assert_eq!(files.sample(&cpus).unwrap().len(), cpus.len());
    }

    #[test]
    fn a_file_read_from_its_start_is_read_whole_and_anew() {
        let dir = std::env::temp_dir().join(format!("hvstats-lp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("text");
        let long: String = (0..3000).map(|i| format!("{i} ")).collect();
        std::fs::write(&path, &long).unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = Vec::new();
        assert_eq!(read_from_start(&file, &mut buf).unwrap(), long.as_bytes(), "more than one read's worth");
        std::fs::write(&path, "3\n").unwrap();
        assert_eq!(
            read_from_start(&file, &mut buf).unwrap(),
            b"3\n",
            "the same descriptor sees the new, shorter text"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn idle_states_past_the_files_held_are_read_by_path_and_every_one_anew() {
        let tree = std::env::temp_dir().join(format!("hvstats-lp-idle-{}", std::process::id()));
        let write = |state: &str, usage: u64, time: u64| {
            let dir = tree.join("cpu3/cpuidle").join(state);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("name"), format!("C{state}\n")).unwrap();
            std::fs::write(dir.join("usage"), format!("{usage}\n")).unwrap();
            std::fs::write(dir.join("time"), format!("{time}\n")).unwrap();
        };
        for (i, state) in ["state0", "state1", "state2"].into_iter().enumerate() {
            write(state, 10 + i as u64, 100 + i as u64);
        }
        // Room for one state's two files: the other two are read by path.
        let mut room = 2;
        let held = hold_idle_states(&tree, 3, &mut room);
        assert_eq!(room, 0);
        assert_eq!(held.iter().map(|s| s.files.is_some()).collect::<Vec<_>>(), [true, false, false]);
        let mut buf = Vec::new();
        let read = read_held_idle_states(&held, &mut buf).unwrap();
        assert_eq!(read, read_idle_states(&tree, 3), "as a reading of the tree by path");
        assert_eq!((read[2].name.as_str(), read[2].usage, read[2].time_us), ("Cstate2", 12, 102));
        write("state0", 5000, 7000);
        write("state2", 6000, 8000);
        let read = read_held_idle_states(&held, &mut buf).unwrap();
        assert_eq!(
            [(read[0].usage, read[0].time_us), (read[2].usage, read[2].time_us)],
            [(5000, 7000), (6000, 8000)]
        );
        // A state gone fails the reading: the caller lists the states again.
        std::fs::remove_dir_all(tree.join("cpu3/cpuidle/state2")).unwrap();
        assert_eq!(read_held_idle_states(&held, &mut buf), None);
        std::fs::remove_dir_all(&tree).unwrap();
    }

    #[test]
    fn cpu_lists_with_ranges_and_singles() {
        assert_eq!(parse_cpu_list("0-3,5,8-9\n").unwrap(), vec![0, 1, 2, 3, 5, 8, 9]);
        assert_eq!(parse_cpu_list("0\n").unwrap(), vec![0]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
    }

    #[test]
    fn this_host_has_an_online_cpu() {
        assert!(!online_cpus().is_empty());
    }
}
