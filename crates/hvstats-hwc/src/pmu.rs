//! The shape of the PMU: how many counters each processor has, discovered or configured.
//!
//! The allocator needs to know which counter indices exist on which processor, and whether there is
//! a PMU at all. Discovery asks the kernel first (`/sys/bus/event_source/devices/cpu`, or
//! `cpu_core`/`cpu_atom` on hybrid parts: perf registers these only when it drives a hardware PMU)
//! and CPUID second for the counts and widths, on each processor in turn (leaf 0xA on Intel;
//! 0x80000022 or the core counter extension on AMD). A machine whose kernel has no hardware PMU, as in most virtual machines, has
//! none, and says why. A shape can also be given in configuration (`HVSTATS_PMU`), so the rules
//! can be exercised on such machines.
//!
//! Counter indices: on each processor the general-purpose counters come first (`0..gp`), then the
//! fixed counters (`gp..gp + fixed`). At most [`MAX_COUNTERS_PER_CPU`] counters per processor.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The environment variable that configures the PMU shape instead of discovering it.
///
/// Syntax: `none[,cpus=N]` (no PMU on N processors), or
/// `gp=G,fixed=F,cpus=N[,gp_width=W][,fixed_width=W]` (G general-purpose and F fixed counters on
/// each of N processors; widths 1 to 64 bits, 48 by default).
pub const PMU_ENV: &str = "HVSTATS_PMU";

/// The most counters one processor may have (the allocator keeps them in a 64-bit mask).
pub const MAX_COUNTERS_PER_CPU: u32 = 64;

/// The widest counter, in bits (a counter is read into 64 bits; real PMUs have 48).
pub const MAX_COUNTER_WIDTH: u32 = 64;

/// The most processors a shape may describe (1024 processor groups of 64 would be far more than
/// any host; this keeps a bad configuration from allocating without bound).
pub const MAX_PROCESSORS: u32 = 64 * 1024;

/// The counters of one processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CpuCounters {
    /// General-purpose counters (indices `0..gp`).
    pub gp: u32,
    /// Width of a general-purpose counter in bits.
    pub gp_width: u32,
    /// Fixed-function counters (indices `gp..gp + fixed`).
    pub fixed: u32,
    /// Width of a fixed-function counter in bits.
    pub fixed_width: u32,
}

impl CpuCounters {
    /// All counters of the processor.
    pub const fn total(&self) -> u32 {
        self.gp + self.fixed
    }
}

impl fmt::Display for CpuCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} general-purpose x {} bits", self.gp, self.gp_width)?;
        if self.fixed > 0 {
            write!(f, ", {} fixed x {} bits", self.fixed, self.fixed_width)?;
        }
        Ok(())
    }
}

/// Where a shape came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShapeSource {
    /// Found on this machine.
    Discovered,
    /// Given in configuration.
    Configured,
}

/// The processors of the host and the counters each has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PmuShape {
    processors: u32,
    /// Per processor; empty when there is no PMU.
    counters: Vec<CpuCounters>,
    absent_reason: Option<PmuError>,
    source: ShapeSource,
}

/// Why a host has no PMU hvstats can use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PmuError {
    /// The kernel has no hardware PMU driver bound.
    #[error(
        "the kernel drives no hardware PMU ({} has no cpu, cpu_core or cpu_atom){}",
        devices.display(),
        if *under_hypervisor { "; running under a hypervisor that does not expose one" } else { "" }
    )]
    NoKernelPmu {
        /// The event-source directory examined.
        devices: PathBuf,
        /// CPUID says a hypervisor runs this host.
        under_hypervisor: bool,
    },
    /// No processor could be examined (none could be pinned to).
    #[error("no processor could be examined with CPUID")]
    NoProcessorExamined,
    /// The thread examining the processors failed.
    #[error("PMU discovery thread failed")]
    DiscoveryThread,
    /// A CPU vendor whose PMU hvstats does not know.
    #[error("unknown CPU vendor {0:?}")]
    UnknownVendor(String),
    /// Intel without CPUID leaf 0xA.
    #[error("CPUID leaf 0xA is beyond the maximum leaf {0:#x}")]
    NoPerfmonLeaf(u32),
    /// Intel architectural performance monitoring version 0.
    #[error("CPUID leaf 0xA reports architectural performance monitoring version 0")]
    PerfmonVersionZero,
    /// An architecture PMU discovery does not cover.
    #[error("PMU discovery is implemented for x86-64 only")]
    UnsupportedArchitecture,
    /// Configured as absent, for the reason given.
    #[error("{0}")]
    Configured(String),
}

impl Serialize for PmuError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A configured shape that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad PMU configuration {text:?}: {reason}")]
pub struct ShapeError {
    /// The [`PMU_ENV`] text as given, or the shape asked for spelled out.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl PmuShape {
    /// `gp` general-purpose and `fixed` fixed counters (48 bits wide) on each of `processors`.
    ///
    /// # Errors
    /// When there are no processors, more than [`MAX_PROCESSORS`], or more than
    /// [`MAX_COUNTERS_PER_CPU`] counters per processor.
    pub fn uniform(processors: u32, gp: u32, fixed: u32) -> Result<Self, ShapeError> {
        Self::uniform_with(processors, CpuCounters { gp, gp_width: 48, fixed, fixed_width: 48 })
    }

    /// `counters` on each of `processors`.
    ///
    /// # Errors
    /// As [`PmuShape::uniform`], and when a kind of counter that exists has a width outside
    /// `1..=`[`MAX_COUNTER_WIDTH`] bits.
    pub(crate) fn uniform_with(processors: u32, counters: CpuCounters) -> Result<Self, ShapeError> {
        let text = format!("{counters} on each of {processors} processors");
        check_processors(processors, &text)?;
        if counters.gp.checked_add(counters.fixed).is_none_or(|n| n > MAX_COUNTERS_PER_CPU) {
            return Err(ShapeError { text, reason: format!("more than {MAX_COUNTERS_PER_CPU} counters") });
        }
        for (key, count, width) in [
            ("gp_width", counters.gp, counters.gp_width),
            ("fixed_width", counters.fixed, counters.fixed_width),
        ] {
            if count > 0 && !(1..=MAX_COUNTER_WIDTH).contains(&width) {
                let reason = format!("{key}={width} is not in 1..={MAX_COUNTER_WIDTH} bits");
                return Err(ShapeError { text, reason });
            }
        }
        Ok(Self {
            processors,
            counters: vec![counters; processors as usize],
            absent_reason: None,
            source: ShapeSource::Configured,
        })
    }

    /// No PMU on `processors` processors, for `reason`.
    ///
    /// # Errors
    /// When there are no processors or more than [`MAX_PROCESSORS`].
    pub fn absent(processors: u32, reason: impl Into<String>) -> Result<Self, ShapeError> {
        let reason = reason.into();
        check_processors(processors, &reason)?;
        Ok(Self {
            processors,
            counters: Vec::new(),
            absent_reason: Some(PmuError::Configured(reason)),
            source: ShapeSource::Configured,
        })
    }

    /// Parses the [`PMU_ENV`] syntax; `processors` is used when the text names no `cpus=`.
    ///
    /// # Errors
    /// On unknown keys, bad numbers, missing counts or limits exceeded.
    pub fn parse(text: &str, processors: u32) -> Result<Self, ShapeError> {
        let bad = |reason: String| ShapeError { text: text.to_owned(), reason };
        let mut none = false;
        let (mut gp, mut fixed, mut cpus) = (None, None, None);
        let (mut gp_width, mut fixed_width) = (48, 48);
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "none" {
                none = true;
                continue;
            }
            let (key, value) =
                item.split_once('=').ok_or_else(|| bad(format!("{item:?} is not key=value")))?;
            let value: u32 =
                value.trim().parse().map_err(|_| bad(format!("{key}: {value:?} is not a number")))?;
            match key.trim() {
                "gp" => gp = Some(value),
                "fixed" => fixed = Some(value),
                "cpus" => cpus = Some(value),
                "gp_width" => gp_width = value,
                "fixed_width" => fixed_width = value,
                other => return Err(bad(format!("unknown key {other:?}"))),
            }
        }
        let processors = cpus.unwrap_or(processors);
        let mut shape = if none {
            if gp.is_some() || fixed.is_some() {
                return Err(bad("\"none\" cannot name counters".into()));
            }
            Self::absent(processors, format!("configured by {PMU_ENV}"))
        } else {
            let gp = gp.ok_or_else(|| bad("gp= is missing".into()))?;
            let counters = CpuCounters { gp, gp_width, fixed: fixed.unwrap_or(0), fixed_width };
            if counters.total() == 0 {
                return Err(bad("a PMU needs at least one counter (use \"none\")".into()));
            }
            Self::uniform_with(processors, counters)
        }
        .map_err(|e| bad(e.reason))?;
        shape.source = ShapeSource::Configured;
        Ok(shape)
    }

    /// The shape from [`PMU_ENV`] when it is set, otherwise the one discovered on this machine.
    ///
    /// # Errors
    /// When [`PMU_ENV`] is set and cannot be parsed.
    pub fn from_env_or_discover() -> Result<Self, ShapeError> {
        match std::env::var(PMU_ENV) {
            Ok(text) if !text.trim().is_empty() => Self::parse(&text, host_processor_count()),
            _ => Ok(Self::discover()),
        }
    }

    /// Discovers the PMU of this machine (see the module documentation).
    pub fn discover() -> Self {
        discover_in(Path::new("/sys/bus/event_source/devices"), host_processor_count())
    }

    /// The number of processors (Linux CPUs `0..processors`).
    pub fn processors(&self) -> u32 {
        self.processors
    }

    /// Whether there is a PMU.
    pub fn is_present(&self) -> bool {
        self.absent_reason.is_none()
    }

    /// Why there is no PMU, when there is none.
    pub fn absent_reason(&self) -> Option<&PmuError> {
        self.absent_reason.as_ref()
    }

    /// Where the shape came from.
    pub fn source(&self) -> ShapeSource {
        self.source
    }

    /// The counters of processor `cpu`; `None` when there is no PMU or no such processor.
    pub fn counters(&self, cpu: u32) -> Option<&CpuCounters> {
        self.counters.get(cpu as usize)
    }

    /// A canonical description of what the allocator decides by (processors and their counters,
    /// not the wording of a reason), recorded in the table so that processes that disagree about
    /// the PMU do not share one.
    pub fn fingerprint(&self) -> String {
        if !self.is_present() {
            return format!("no PMU on {} processors", self.processors);
        }
        let runs: Vec<String> = self
            .runs()
            .iter()
            .map(|(a, b, c)| format!("{a}-{b}: {}x{} + {}x{}", c.gp, c.gp_width, c.fixed, c.fixed_width))
            .collect();
        format!("{} processors; {}", self.processors, runs.join("; "))
    }

    /// Runs of consecutive processors with the same counters, as (first, last, counters).
    pub fn runs(&self) -> Vec<(u32, u32, CpuCounters)> {
        let mut runs: Vec<(u32, u32, CpuCounters)> = Vec::new();
        for (cpu, c) in self.counters.iter().enumerate() {
            let cpu = cpu as u32;
            match runs.last_mut() {
                Some((_, last, prev)) if *prev == *c && *last + 1 == cpu => *last = cpu,
                _ => runs.push((cpu, cpu, *c)),
            }
        }
        runs
    }
}

fn check_processors(processors: u32, text: &str) -> Result<(), ShapeError> {
    if processors == 0 || processors > MAX_PROCESSORS {
        return Err(ShapeError {
            text: text.to_owned(),
            reason: format!("processor count {processors} is not in 1..={MAX_PROCESSORS}"),
        });
    }
    Ok(())
}

/// The number of processors Linux has configured (`_SC_NPROCESSORS_CONF`), at least 1.
pub(crate) fn host_processor_count() -> u32 {
    // SAFETY: sysconf reads a system value and has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    u32::try_from(n).ok().filter(|&n| n > 0).map_or(1, |n| n.min(MAX_PROCESSORS))
}

/// Discovery with the event-source directory given, so it can be tested.
pub(crate) fn discover_in(devices: &Path, processors: u32) -> PmuShape {
    let absent = |reason: PmuError| PmuShape {
        processors,
        counters: Vec::new(),
        absent_reason: Some(reason),
        source: ShapeSource::Discovered,
    };
    if devices.is_dir() {
        let names = ["cpu", "cpu_core", "cpu_atom"];
        if !names.iter().any(|n| devices.join(n).is_dir()) {
            return absent(PmuError::NoKernelPmu {
                devices: devices.to_owned(),
                under_hypervisor: cpuid::hypervisor_present(),
            });
        }
    }
    match per_cpu_counters(processors) {
        Ok(counters) => {
            PmuShape { processors, counters, absent_reason: None, source: ShapeSource::Discovered }
        }
        Err(reason) => absent(reason),
    }
}

/// CPUID on each processor in turn, from a thread pinned to it, so hybrid parts (whose core types
/// differ in counters) are described per processor. A processor the thread cannot run on (offline)
/// has no counters.
fn per_cpu_counters(processors: u32) -> Result<Vec<CpuCounters>, PmuError> {
    let none = CpuCounters { gp: 0, gp_width: 0, fixed: 0, fixed_width: 0 };
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            (0..processors)
                .map(|cpu| if pin_to(cpu) { cpuid::counters().map(Some) } else { Ok(None) })
                .collect::<Result<Vec<Option<CpuCounters>>, PmuError>>()
        })
        .join()
    })
    .map_err(|_| PmuError::DiscoveryThread)??;
    if results.iter().all(Option::is_none) {
        return Err(PmuError::NoProcessorExamined);
    }
    Ok(results.into_iter().map(|c| c.unwrap_or(none)).collect())
}

/// Pins the calling thread to `cpu`; false when it cannot run there.
fn pin_to(cpu: u32) -> bool {
    let cpu = cpu as usize;
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: cpu_set_t is plain data (zeroed = empty); CPU_SET writes a bit below its size, checked
    // above; sched_setaffinity reads the set we own and changes only this thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Counts and widths from CPUID, on the processor the caller runs on.
mod cpuid {
    use super::{CpuCounters, MAX_COUNTERS_PER_CPU, PmuError};

    #[cfg(target_arch = "x86_64")]
    fn leaf(eax: u32) -> [u32; 4] {
        let r = core::arch::x86_64::__cpuid_count(eax, 0);
        [r.eax, r.ebx, r.ecx, r.edx]
    }

    /// CPUID.1:ECX bit 31.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn hypervisor_present() -> bool {
        leaf(1)[2] & (1 << 31) != 0
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) fn hypervisor_present() -> bool {
        false
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn counters() -> Result<CpuCounters, PmuError> {
        Err(PmuError::UnsupportedArchitecture)
    }

    #[cfg(target_arch = "x86_64")]
    pub fn counters() -> Result<CpuCounters, PmuError> {
        let [max, ebx, ecx, edx] = leaf(0);
        let vendor: Vec<u8> = [ebx, edx, ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        let c = match &vendor[..] {
            b"GenuineIntel" => intel(max)?,
            b"AuthenticAMD" | b"HygonGenuine" => amd(),
            other => return Err(PmuError::UnknownVendor(String::from_utf8_lossy(other).into_owned())),
        };
        Ok(CpuCounters {
            gp: c.gp.min(MAX_COUNTERS_PER_CPU),
            fixed: c.fixed.min(MAX_COUNTERS_PER_CPU - c.gp.min(MAX_COUNTERS_PER_CPU)),
            gp_width: c.gp_width.min(super::MAX_COUNTER_WIDTH),
            fixed_width: c.fixed_width.min(super::MAX_COUNTER_WIDTH),
        })
    }

    /// Leaf 0xA: EAX[7:0] version, [15:8] GP counters, [23:16] GP width; EDX[4:0] fixed counters,
    /// [12:5] fixed width (version 2 and later).
    #[cfg(target_arch = "x86_64")]
    fn intel(max: u32) -> Result<CpuCounters, PmuError> {
        if max < 0xA {
            return Err(PmuError::NoPerfmonLeaf(max));
        }
        let [eax, _, _, edx] = leaf(0xA);
        let version = eax & 0xff;
        if version == 0 {
            return Err(PmuError::PerfmonVersionZero);
        }
        let fixed = if version >= 2 { edx & 0x1f } else { 0 };
        Ok(CpuCounters {
            gp: (eax >> 8) & 0xff,
            gp_width: (eax >> 16) & 0xff,
            fixed,
            fixed_width: if fixed > 0 { (edx >> 5) & 0xff } else { 0 },
        })
    }

    /// Leaf 0x80000022 EBX[3:0] (PerfMonV2) when present; otherwise six core counters with the
    /// core counter extension (0x80000001 ECX bit 23), else the four legacy ones; all 48 bits.
    #[cfg(target_arch = "x86_64")]
    fn amd() -> CpuCounters {
        let max_ext = leaf(0x8000_0000)[0];
        let ext_core = max_ext >= 0x8000_0001 && leaf(0x8000_0001)[2] & (1 << 23) != 0;
        let v2 = if max_ext >= 0x8000_0022 { leaf(0x8000_0022)[1] & 0xf } else { 0 };
        let gp = if v2 > 0 {
            v2
        } else if ext_core {
            6
        } else {
            4
        };
        CpuCounters { gp, gp_width: 48, fixed: 0, fixed_width: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_configured_shapes() {
        let s = PmuShape::parse("gp=6, fixed=3, cpus=128", 2).unwrap();
        assert_eq!(s.processors(), 128);
        assert!(s.is_present());
        assert_eq!(s.counters(127), Some(&CpuCounters { gp: 6, gp_width: 48, fixed: 3, fixed_width: 48 }));
        assert_eq!(s.counters(128), None);
        assert_eq!(s.runs(), vec![(0, 127, *s.counters(0).unwrap())]);

        let s = PmuShape::parse("none", 2).unwrap();
        assert_eq!(s.processors(), 2);
        assert!(!s.is_present());
        assert_eq!(s.counters(0), None);

        let s = PmuShape::parse("gp=4,gp_width=40", 3).unwrap();
        assert_eq!(s.counters(2).unwrap().gp_width, 40);
        assert_eq!(s.counters(2).unwrap().fixed, 0);
    }

    #[test]
    fn parse_rejects_bad_configuration() {
        for text in
            ["gp=x", "gp=6,bogus=1", "cpus=4", "gp=0", "none,gp=1", "gp=60,fixed=5", "gp=1,cpus=0", "gp"]
        {
            assert!(PmuShape::parse(text, 2).is_err(), "{text} should be rejected");
        }
    }

    #[test]
    fn counter_widths_are_bounded_and_the_refusal_names_the_bound() {
        for (text, key) in [
            ("gp=4,gp_width=200", "gp_width=200"),
            ("gp=4,gp_width=0", "gp_width=0"),
            ("gp=4,fixed=3,fixed_width=65", "fixed_width=65"),
        ] {
            let e = PmuShape::parse(text, 2).unwrap_err();
            assert_eq!(e.reason, format!("{key} is not in 1..=64 bits"), "{text}");
        }
        // A width of a kind of counter that does not exist is not checked; 64 bits is allowed.
        assert!(PmuShape::parse("gp=4,fixed_width=0", 2).is_ok());
        assert_eq!(PmuShape::parse("gp=4,gp_width=64", 2).unwrap().counters(1).unwrap().gp_width, 64);
    }

    #[test]
    fn discovery_without_event_source_pmu_says_none() {
        let dir = std::env::temp_dir().join(format!("hvstats-pmu-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("software")).unwrap();
        let s = discover_in(&dir, 2);
        assert!(!s.is_present());
        assert!(
            matches!(s.absent_reason(), Some(PmuError::NoKernelPmu { devices, .. }) if *devices == dir),
            "{:?}",
            s.absent_reason()
        );
        assert!(s.absent_reason().unwrap().to_string().contains("no hardware PMU"));
        std::fs::create_dir_all(dir.join("cpu")).unwrap();
        let s = discover_in(&dir, 2);
        // With a registered PMU the counts come from CPUID on each processor, which either gives
        // counters for every processor that runs or a reason.
        if s.is_present() {
            assert_eq!(s.runs().iter().map(|r| r.1 - r.0 + 1).sum::<u32>(), 2);
            assert!(s.counters(0).is_some_and(|c| c.total() > 0), "{s:?}");
        } else {
            assert!(!matches!(s.absent_reason(), None | Some(PmuError::NoKernelPmu { .. })), "{s:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_machine_is_described_truthfully() {
        let s = PmuShape::discover();
        let registered = ["cpu", "cpu_core", "cpu_atom"]
            .iter()
            .any(|n| Path::new("/sys/bus/event_source/devices").join(n).is_dir());
        if !registered {
            assert!(!s.is_present(), "no PMU is registered with perf, yet discovery found {s:?}");
        }
    }
}
