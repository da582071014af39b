//! `hvstats observe`: Hyper-V VP counters for KVM VMs other processes run (QEMU, Firecracker,
//! cloud-hypervisor, crosvm, kvmtool), published as partitions of this process's instance so
//! every reader (`snapshot`, …) shows them beside hvstats' own partitions.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_kvm::observe::publication;
use hvstats_kvm::observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets, raise_fd_limit};

use crate::signals;

/// Flags of `hvstats observe`.
#[derive(clap::Args)]
pub struct Args {
    /// Observe the KVM VM of this process (repeatable).
    #[arg(long = "pid", value_name = "PID", required_unless_present = "all", conflicts_with = "all")]
    pids: Vec<i32>,
    /// Observe every process on the host holding a KVM VM, dropping gone ones within one interval
    /// and picking up new ones within two (a VM is attached once its vCPU count held still).
    #[arg(long)]
    all: bool,
    /// A QMP socket of the observed QEMU: KVM's statistics and the vCPU threads come from it
    /// (only with a single --pid).
    #[arg(long, value_name = "PATH")]
    qmp: Option<PathBuf>,
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
    match s.parse::<f64>() {
        Ok(v) if (0.01..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: the interval is a number of seconds from 0.01 to 3600")),
    }
}

/// Runs the observer until SIGINT/SIGTERM, or until every `--pid` process has exited.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.qmp.is_some() && args.pids.len() != 1 {
        bail!("--qmp names the socket of one QEMU: give exactly one --pid with it");
    }
    if let Some(p) = args.pids.iter().find(|p| **p <= 0) {
        bail!("--pid {p}: not a process id");
    }
    signals::block().context("cannot block SIGINT/SIGTERM")?;
    match raise_fd_limit() {
        Ok(n) => log(&format!("open file limit {n}")),
        Err(e) => log(&format!("cannot raise the open file limit: {e}")),
    }
    let dir = super::runtime_dir(args.runtime_dir)?;
    log(&format!("counting {}", publication::counting_method().1));
    let config = InstanceConfig {
        runtime_dir: Some(dir.clone()),
        description: publication::description(),
        ..Default::default()
    };
    let hv = Hypervisor::with_config(config)
        .with_context(|| format!("cannot publish an instance under {}", dir.display()))?;
    if let Some(name) = hv.published_name() {
        log(&format!("publishing observed VMs as instance {name} in {}", dir.display()));
    }
    let procfs = match args.proc_root {
        Some(root) => Procfs::at(root, None),
        None => Procfs::host(),
    };
    let targets = if args.all { Targets::All } else { Targets::Pids(args.pids) };
    let mut observer = Observer::new(hv.clone(), procfs, targets, ObserveOptions { qmp: args.qmp });
    let interval = Duration::from_secs_f64(args.interval);
    let mut failed = false;
    loop {
        // The instance's LP pages, as every instance keeps them; a host without procfs leaves them.
        let _ = hv.refresh_lps();
        for event in observer.tick() {
            failed |= matches!(event, ObserverEvent::Failed { .. });
            log(&describe(&event));
        }
        if observer.finished() {
            log("no observed process is left");
            return Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS });
        }
        if let Some(signal) = signals::take(interval).context("cannot wait for signals")?.map(|s| s.name()) {
            log(&format!("{signal}: detaching from {} VMs", observer.vms().count()));
            return Ok(ExitCode::SUCCESS);
        }
    }
}

pub(crate) fn describe(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::Attached { pid, name, vmm, vcpus, partition, fds, qmp_error } => {
            let mut s = format!(
                "attach pid {pid} ({vmm}) \"{name}\": {vcpus} vCPUs as partition {partition}, {fds} perf counters open"
            );
            if let Some(e) = qmp_error {
                s.push_str(&format!("; KVM statistics through QMP unavailable: {e}"));
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
        ObserverEvent::Detached { pid, name } => format!("detach pid {pid} \"{name}\": the process exited"),
        ObserverEvent::Failed { pid, error } => format!("cannot observe pid {pid}: {error}"),
    }
}

/// A line on stderr; a closed stderr is ignored.
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "hvstats observe: {line}");
}
