//! `hvstats observe`: Hyper-V VP counters for KVM VMs other processes run (QEMU, Firecracker,
//! cloud-hypervisor, crosvm, kvmtool), published as partitions of this process's instance so
//! every reader (`snapshot`, …) shows them beside hvstats' own partitions; and, with `--mshv`, the
//! Microsoft Hypervisor's own counters where Linux is its root partition, as an instance of their
//! own (see `docs/mshv.md`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hvstats::text::Escaped;
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_kvm::mshv::{self, MshvEvent, MshvObserver};
use hvstats_kvm::observe::publication;
use hvstats_kvm::observe::qmp::{CANCEL_POLL, Cancel};
use hvstats_kvm::observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets, raise_fd_limit};

use crate::signals;

/// Flags of `hvstats observe`.
#[derive(clap::Args)]
pub struct Args {
    /// Observe the KVM VM of this process (repeatable).
    #[arg(
        long = "pid",
        value_name = "PID",
        required_unless_present_any = ["all", "mshv"],
        conflicts_with = "all"
    )]
    pids: Vec<i32>,
    /// Observe every process on the host holding a KVM VM, dropping gone ones within one interval
    /// and picking up new ones within two (a VM is attached once its vCPU count held still).
    #[arg(long)]
    all: bool,
    /// A QMP socket of the observed QEMU: KVM's statistics and the vCPU threads come from it
    /// (only with a single --pid).
    #[arg(long, value_name = "PATH")]
    qmp: Option<PathBuf>,
    /// Publish the Microsoft Hypervisor's own counters from Linux's mshv debugfs tree (where Linux
    /// is its root partition) as an instance of their own: alone, or beside --pid/--all.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = hvstats::mshv::tree::DEFAULT_ROOT)]
    mshv: Option<PathBuf>,
    /// With --mshv: list the names the tree prints that the catalog has no counter for, and exit.
    #[arg(long, requires = "mshv")]
    list_unknown: bool,
    /// Seconds between refreshes of the pages.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_interval)]
    interval: f64,
    /// The runtime directory to publish under (default: $HVSTATS_RUNTIME_DIR, or /run/hvstats).
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// Read processes from this procfs tree instead of /proc (for tests).
    #[arg(long, value_name = "DIR", hide = true)]
    proc_root: Option<PathBuf>,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    crate::cmd::seconds_in(s, 0.01, 3600.0)
}

/// Runs the observer until SIGINT/SIGTERM, or until every `--pid` process has exited.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.qmp.is_some() && args.pids.len() != 1 {
        bail!("--qmp names the socket of one QEMU: give exactly one --pid with it");
    }
    if let Some(p) = args.pids.iter().find(|p| **p <= 0) {
        bail!("--pid {p}: not a process id");
    }
    if let (Some(root), true) = (&args.mshv, args.list_unknown) {
        return list_unknown(root);
    }
    signals::block().context("cannot block SIGINT/SIGTERM")?;
    match raise_fd_limit() {
        Ok(n) => log(&format!("open file limit {n}")),
        Err(e) => log(&format!("cannot raise the open file limit: {e}")),
    }
    let dir = super::runtime_dir(args.runtime_dir)?;
    let mut mshv = match &args.mshv {
        Some(root) => Some(start_mshv(root, &dir)?),
        None => None,
    };
    let observing = args.all || !args.pids.is_empty();
    if observing {
        log(&format!("counting {}", publication::counting_method().1));
    }
    let config = InstanceConfig {
        runtime_dir: Some(dir.clone()),
        description: publication::description(),
        ..Default::default()
    };
    let hv = match observing {
        true => Some(
            Hypervisor::with_config(config)
                .with_context(|| format!("cannot publish an instance under {}", dir.display()))?,
        ),
        false => None,
    };
    if let Some(name) = hv.as_ref().and_then(|hv| hv.published_name()) {
        log(&format!("publishing observed VMs as instance {name} in {}", dir.display()));
    }
    let procfs = match args.proc_root {
        Some(root) => Procfs::at(root, None),
        None => Procfs::host(),
    };
    let targets = if args.all { Targets::All } else { Targets::Pids(args.pids) };
    let cancel = Cancel::new();
    let mut observer = hv.clone().map(|hv| {
        let options =
            ObserveOptions { qmp: args.qmp.clone(), cancel: cancel.clone(), claims: Some(dir.clone()) };
        Observer::new(hv, procfs, targets, options)
    });
    let interval = Duration::from_secs_f64(args.interval);
    // The observer runs on this thread while a watcher takes SIGINT/SIGTERM: a signal cancels
    // whatever the observer waits on (a QMP peer that drips, streams or hangs) within 0.1 s.
    let stop = cancel.clone();
    let (failed, signal) = signals::during(
        |_| observe(observer.as_mut(), hv.as_deref(), mshv.as_mut(), interval, &cancel),
        move |_| stop.cancel(),
    )
    .context("cannot wait for signals")?;
    match signal {
        Some(signal) => {
            let vms = observer.as_ref().map_or(0, |o| o.vms().count());
            log(&format!("{}: detaching from {vms} VMs", signal.name()));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            log("no observed process is left");
            Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
    }
}

/// Ticks `observer` and the mshv reader every `interval` until every `--pid` process is gone
/// (then returns whether any failed; never while an mshv tree is read) or `cancel` is set.
fn observe(
    mut observer: Option<&mut Observer>,
    hv: Option<&Hypervisor>,
    mut mshv: Option<&mut MshvObserver>,
    interval: Duration,
    cancel: &Cancel,
) -> bool {
    let mut failed = false;
    loop {
        if let Some(m) = mshv.as_deref_mut() {
            for event in m.tick() {
                log(&describe_mshv(&event));
            }
        }
        // The instance's LP pages, as every instance keeps them; a host without procfs leaves them.
        if let Some(hv) = hv {
            let _ = hv.refresh_lps();
        }
        if let Some(observer) = observer.as_deref_mut() {
            for event in observer.tick() {
                failed |= matches!(event, ObserverEvent::Failed { .. });
                log(&describe(&event));
            }
            if observer.finished() && mshv.is_none() {
                return failed;
            }
        }
        if cancel.is_cancelled() {
            return failed;
        }
        let until = Instant::now() + interval;
        while Instant::now() < until {
            if cancel.is_cancelled() {
                return failed;
            }
            std::thread::sleep(CANCEL_POLL.min(until.saturating_duration_since(Instant::now())));
        }
    }
}

/// Reads the mshv tree once and publishes it as an instance of its own.
fn start_mshv(root: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<MshvObserver> {
    let tree = mshv::read_tree(root).context("--mshv")?;
    let config = mshv::instance_config(root, &tree, Some(dir.to_owned()));
    let hv = Hypervisor::with_config(config)
        .with_context(|| format!("cannot publish an instance under {}", dir.display()))?;
    if let Some(name) = hv.published_name() {
        log(&format!(
            "publishing the Microsoft Hypervisor's counters from {} as instance {name} in {}",
            root.display(),
            dir.display()
        ));
    }
    Ok(MshvObserver::new(hv, root.to_owned()))
}

/// `--mshv DIR --list-unknown`: the names the catalog has no counter for, by object kind.
fn list_unknown(root: &std::path::Path) -> anyhow::Result<ExitCode> {
    let tree = mshv::read_tree(root).context("--mshv")?;
    for p in &tree.problems {
        log(&format!("skipped {p}"));
    }
    let mut text = String::new();
    for (kind, names) in mshv::unmapped_names(&tree) {
        for (name, known) in names {
            let note = if known { "" } else { "\t(not in Linux's x86_64 table: a newer or other build)" };
            text.push_str(&format!("{}\t{name}{note}\n", kind.short_name()));
        }
    }
    crate::output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn describe_mshv(event: &MshvEvent) -> String {
    let vps = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    match event {
        MshvEvent::Appeared { key, vps: v } => format!("mshv partition {key}: VPs [{}]", vps(v)),
        MshvEvent::VpsChanged { key, vps: v } => format!("mshv partition {key}: VPs now [{}]", vps(v)),
        MshvEvent::Vanished { key } => format!("mshv partition {key}: gone"),
        MshvEvent::Unmapped { kind, name } => {
            format!("mshv: {} counter {name} has no catalog counter: published by name", kind.short_name())
        }
        MshvEvent::Problem(p) => format!("mshv: skipped {p}"),
        MshvEvent::Unreadable(e) | MshvEvent::Failed(e) => format!("mshv: {e}"),
    }
}

/// The log line of `event`, one line whatever it carries: a VM's name (which its VMM's command
/// line or QMP peer chose) is quoted with its control characters escaped, so it cannot forge or
/// break lines.
pub(crate) fn describe(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::Attached { pid, name, vmm, vcpus, partition, fds, threads, left_out, qmp_error } => {
            let mut s = format!(
                "attach pid {pid} ({}) \"{}\": {vcpus} vCPUs as partition {partition}, {fds} perf counters open",
                Escaped(vmm),
                Escaped(name)
            );
            if *left_out > 0 {
                s.push_str(&format!(
                    " on {threads} of {} threads ({left_out} left out: descriptor budget; a vCPU thread \
                     among them is counted once known)",
                    threads + left_out
                ));
            }
            if let Some(e) = qmp_error {
                s.push_str(&format!("; KVM statistics through QMP unavailable: {}", Escaped(&e.to_string())));
            }
            s
        }
        ObserverEvent::VcpusKnown { pid, threads, fds } => {
            format!("pid {pid}: vCPU threads {threads:?}; {fds} perf counters open (on those threads only)")
        }
        ObserverEvent::KvmExit { pid, state } => format!(
            "pid {pid}: kvm:kvm_exit {}",
            match state {
                hvstats_kvm::observe::KvmExitState::Fires => "fires: intercepts are counted by exit reason",
                hvstats_kvm::observe::KvmExitState::Silent => {
                    "does not fire on this host (no VMX/SVM exits): HLT, MWAIT, DR, other intercepts come only from QMP or are unavailable"
                }
                hvstats_kvm::observe::KvmExitState::NoHardwareVirtualization =>
                    "is not counted: KVM here is not VMX/SVM",
                hvstats_kvm::observe::KvmExitState::Undecided => "undecided",
            }
        ),
        // A VM's name is what its VMM's command line or QMP says: escaped, it cannot forge a line.
        ObserverEvent::Detached { pid, name } => {
            format!("detach pid {pid} \"{}\": the process exited", Escaped(name))
        }
        ObserverEvent::Deferred { pid, reason } => {
            format!("pid {pid} not observed for now (retried): {}", Escaped(reason))
        }
        ObserverEvent::Failed { pid, error } => format!("cannot observe pid {pid}: {}", Escaped(error)),
    }
}

/// A line on stderr; a closed stderr is ignored.
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "hvstats observe: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_name_cannot_forge_a_log_line() {
        let event =
            ObserverEvent::Detached { pid: 7, name: "dup\nhvstats observe: attach pid 1\u{1b}[2J".into() };
        let line = describe(&event);
        assert_eq!(line, r#"detach pid 7 "dup\nhvstats observe: attach pid 1\u{1b}[2J": the process exited"#);
        assert!(!line.contains('\n') && !line.contains('\u{1b}'));
    }
}
