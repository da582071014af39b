//! `hvstats observe`: Hyper-V VP counters for KVM VMs other processes run (QEMU, Firecracker,
//! cloud-hypervisor, crosvm, kvmtool), published as partitions of this process's instance so
//! every reader (`snapshot`, …) shows them beside hvstats' own partitions; and, with `--mshv`, the
//! Microsoft Hypervisor's own counters where Linux is its root partition, as an instance of their
//! own (see `docs/mshv.md`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_mshv::observer::{self as mshv, MshvObserver};
use hvstats_observe::cancel::Cancel;
use hvstats_observe::filter::{VmFilter, VmPattern};
use hvstats_observe::publication;
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets, raise_fd_limit};

use crate::observer_run::{Ended, Runner};
use crate::signals;

/// Flags of `hvstats observe`: what to observe is one or more of --pid, --all, --qmp, --mshv, and
/// without any the error names them all.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["pids", "all", "qmp", "mshv"])))]
pub(crate) struct Args {
    /// Observe the KVM VM of this process (repeatable).
    #[arg(long = "pid", value_name = "PID", conflicts_with = "all")]
    pids: Vec<i32>,
    /// Observe every process on the host holding a KVM VM, dropping gone ones within one interval
    /// and picking up new ones within two (a VM is attached once its vCPU count held still).
    #[arg(long)]
    all: bool,
    /// A QMP socket of the observed QEMU: KVM's statistics, its run state and the vCPU threads
    /// come from it. With a single --pid, for that process; alone, the QEMU serving the socket,
    /// observed again when it restarts on the same socket. Without it, a QMP socket the QEMU's
    /// command line names is used when no other client holds it (see --no-qmp).
    #[arg(long, value_name = "PATH", conflicts_with = "all")]
    qmp: Option<PathBuf>,
    /// Use no QMP socket a QEMU's command line names (only one given with --qmp).
    #[arg(long)]
    no_qmp: bool,
    /// Observe only the VMs this names: a pid, a UUID, or a regular expression on the VM's name
    /// (repeatable; any may match).
    #[arg(long = "vm", value_name = "PID|UUID|REGEX", value_parser = parse_pattern)]
    vms: Vec<VmPattern>,
    /// Leave out the VMs this names, as --vm names them (repeatable; wins over --vm).
    #[arg(long = "exclude-vm", value_name = "PID|UUID|REGEX", value_parser = parse_pattern)]
    exclude_vms: Vec<VmPattern>,
    /// Publish the Microsoft Hypervisor's own counters from Linux's mshv debugfs tree (where Linux
    /// is its root partition) as an instance of their own: alone, or beside --pid/--all.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = hvstats_mshv::tree::DEFAULT_ROOT)]
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

/// A `--vm` or `--exclude-vm` value.
pub(crate) fn parse_pattern(s: &str) -> Result<VmPattern, String> {
    VmPattern::parse(s).map_err(|e| e.to_string())
}

/// Runs the observer until SIGINT/SIGTERM, or until every `--pid` process has exited.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    check(&args)?;
    if let (Some(root), true) = (&args.mshv, args.list_unknown) {
        return list_unknown(root);
    }
    signals::block().context("cannot block SIGINT/SIGTERM")?;
    match raise_fd_limit() {
        Ok(n) => log(&format!("open file limit {n}")),
        Err(e) => log(&format!("cannot raise the open file limit: {e}")),
    }
    let dir = super::runtime_dir(args.runtime_dir.clone())?;
    let observing = args.all || !args.pids.is_empty() || args.qmp.is_some();
    // Held until the end of `run`, after everything below is dropped: before the kept counts are
    // adopted, a VM claimed or the mark left.
    let _held = match observing {
        true => Some(crate::observer_run::hold_runtime_dir(&dir)?),
        false => None,
    };
    let mut mshv = match &args.mshv {
        Some(root) => Some(start_mshv(root, &dir)?),
        None => None,
    };
    let hv = match observing {
        true => Some(publish(&dir)?),
        false => None,
    };
    let _mark = hv.as_ref().and_then(|hv| crate::observer_run::Mark::leave(&dir, hv, &log));
    let interval = Duration::from_secs_f64(args.interval);
    let cancel = Cancel::new();
    let mut observer = hv.clone().map(|hv| observer_of(args, hv, &dir, &cancel));
    // The observer runs on this thread while a watcher takes SIGINT/SIGTERM: a signal cancels
    // whatever the observer waits on (a QMP peer that drips, streams or hangs) within 0.1 s. The
    // watcher leaves the table of descriptors to the observer, whose reads of a refresh (a few
    // for each vCPU) then take their descriptors without a reference count; cancelling needs none.
    let stop = cancel.clone();
    let (ended, signal) = signals::during_with(
        signals::Table::Apart,
        |_| {
            Runner {
                observer: observer.as_mut(),
                hv: hv.as_deref(),
                mshv: mshv.as_mut(),
                interval,
                cancel: &cancel,
                log: &log,
            }
            .run()
        },
        move |_| stop.cancel(),
    )
    .context("cannot wait for signals")?;
    // Whatever ended it, the VMs it observed may go on: their kept counts go on for the next
    // observer rather than being released as the observer goes.
    if let Some(observer) = &observer {
        observer.leave_kept_counts();
    }
    Ok(exit_status(ended, signal, observer.as_ref()))
}

/// The flags' combinations clap cannot check, and a `--qmp` socket that is not there (a mistyped
/// path, not a QEMU yet to start): said at once.
fn check(args: &Args) -> anyhow::Result<()> {
    if args.qmp.is_some() && args.pids.len() > 1 {
        bail!("--qmp names the socket of one QEMU: give one --pid with it, or none");
    }
    if let Some(p) = args.pids.iter().find(|p| **p <= 0) {
        bail!("--pid {p}: not a process id");
    }
    if let Some(path) = &args.qmp
        && let Err(e) = std::fs::symlink_metadata(path)
    {
        bail!(
            "--qmp {}: {e}: no QMP socket there (a QEMU serves one with -qmp unix:PATH,server=on,wait=off)",
            path.display()
        );
    }
    Ok(())
}

/// The instance the observed VMs are published in, under `dir`.
fn publish(dir: &Path) -> anyhow::Result<Arc<Hypervisor>> {
    log(&counting_line());
    let config = InstanceConfig {
        runtime_dir: Some(dir.to_path_buf()),
        description: publication::description(),
        ..Default::default()
    };
    let hv = Hypervisor::with_config(config)
        .with_context(|| format!("cannot publish an instance under {}", dir.display()))?;
    if let Some(name) = hv.published_name() {
        log(&format!("publishing observed VMs as instance {name} in {}", dir.display()));
    }
    Ok(hv)
}

/// The observer of what the flags name, publishing in `hv` and claiming its VMs under `dir`.
fn observer_of(args: Args, hv: Arc<Hypervisor>, dir: &Path, cancel: &Cancel) -> Observer {
    let procfs = match args.proc_root {
        Some(root) => Procfs::at(root, None),
        None => Procfs::host(),
    };
    let (targets, qmp) = match (args.all, args.pids.is_empty(), args.qmp) {
        (true, _, _) => (Targets::All, None),
        (false, true, Some(socket)) => (Targets::QmpSocket(socket), None),
        (false, _, qmp) => (Targets::Pids(args.pids), qmp),
    };
    let options = ObserveOptions {
        qmp,
        qmp_auto: !args.no_qmp,
        filter: VmFilter { include: args.vms, exclude: args.exclude_vms },
        cancel: cancel.clone(),
        claims: Some(dir.to_path_buf()),
        ..Default::default()
    };
    Observer::new(hv, procfs, targets, options)
}

/// The exit status of an observer that ended so, on `signal` or not, and what it says of it.
fn exit_status(ended: Ended, signal: Option<signals::Signal>, observer: Option<&Observer>) -> ExitCode {
    let failed = match ended {
        Ended::Finished { failed } => failed,
        Ended::Panicked => true,
        Ended::Cancelled => false,
    };
    match signal {
        Some(signal) => {
            let vms = observer.map_or(0, |o| o.vms().count());
            log(&format!("{}: detaching from {vms} VMs", signal.name()));
            ExitCode::SUCCESS
        }
        None if ended == Ended::Panicked => ExitCode::FAILURE,
        None => {
            log("no observed process is left");
            if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
    }
}

/// How the VMs' tracepoints are counted on this host, said at start: a capability that is
/// missing is said in a line of its own (by the observer), not as the errors it causes here; a
/// tracefs that cannot be read is said as it is.
fn counting_line() -> String {
    use hvstats_observe::capabilities::{BPF, Capabilities, PERFMON};
    let (method, why) = publication::counting_method();
    let missing: Vec<&str> = Capabilities::of_this_process()
        .missing()
        .filter(|n| n.bit == BPF || n.bit == PERFMON)
        .map(|n| n.name)
        .collect();
    let tracefs = hvstats_host::tracefs::root().is_ok();
    match (method, missing.is_empty() || !tracefs) {
        (hvstats_observe::thread_counters::Method::Perf, false) => format!(
            "counting with perf counters per thread, where permitted: counting in the kernel needs {} (see \
             the line that names it)",
            missing.join(" and ")
        ),
        _ => format!("counting {why}"),
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

/// `--mshv DIR --list-unknown`: the names the catalog has no counter for, by object kind, each
/// under its one name (mainline's, with the object prefix) whichever kernel printed it.
fn list_unknown(root: &std::path::Path) -> anyhow::Result<ExitCode> {
    let tree = mshv::read_tree(root).context("--mshv")?;
    for p in &tree.problems {
        log(&format!("skipped {p}"));
    }
    if let Some(dialect) = tree.dialect() {
        log(&format!("the tree is printed in {}", dialect.label()));
    }
    let mut text = String::new();
    for (kind, names) in mshv::unmapped_names(&tree) {
        for (name, known) in names {
            let note =
                if known { "" } else { "\t(printed by no kernel hvstats knows: a newer or other build)" };
            text.push_str(&format!("{}\t{name}{note}\n", kind.short_name()));
        }
    }
    crate::output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// A line of `observe`'s log on standard error (see [`crate::output::log`]).
fn log(line: &str) {
    crate::output::log("observe", line);
}
