//! `serve --observe-all`: the observer of `hvstats observe --all` running inside the exporter, so
//! one process on a host exports every KVM VM on it — the VMs of other processes (QEMU,
//! Firecracker, …) published as partitions of the observer's own instance, read by the exporter
//! like any other instance. A VM another observer already claims is left to it (its publisher is
//! read like any other instance). The loop is `observe`'s own ([`crate::observer_run`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_observe::cancel::Cancel;
use hvstats_observe::filter::VmFilter;
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets, publication, raise_fd_limit};

use crate::observer_run::{Ended, Mark, Runner};

/// A line of `serve`'s log on standard error (see [`crate::output::log`]): the observer's, and
/// the exporter's own.
pub(crate) fn log(line: &str) {
    crate::output::log("serve", line);
}

/// How serve observes: every VM the filter takes, using the QMP sockets their command lines
/// name unless told not to.
pub(crate) struct Observing {
    /// The runtime directory, taken for this observer ([`crate::observer_run::hold_runtime_dir`])
    /// and released once everything it left there is gone.
    pub held: hvstats::observer_lock::ObserverLock,
    /// Seconds between refreshes.
    pub interval: Duration,
    /// `--vm`, `--exclude-vm`.
    pub filter: VmFilter,
    /// `--no-qmp`.
    pub no_qmp: bool,
}

/// The observer running on its own thread; [`stop`](Self::stop) ends it, removes its instance
/// and releases its claims.
pub(crate) struct Running {
    cancel: Cancel,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    /// Stops the observer (a QMP wait ends within [`CANCEL_POLL`](hvstats_observe::cancel::CANCEL_POLL)) and waits until its instance
    /// files are removed.
    pub(crate) fn stop(self) {
        self.cancel.cancel();
        if self.thread.join().is_err() {
            log("the observer thread panicked");
        }
    }
}

/// Publishes an observer instance under `runtime_dir` (held by `how.held`) and refreshes it as
/// `how` says on its own thread, until [`Running::stop`].
///
/// # Errors
/// When the instance cannot be published or the thread cannot start.
pub(crate) fn start(runtime_dir: &Path, how: Observing) -> anyhow::Result<Running> {
    if let Err(e) = raise_fd_limit() {
        log(&format!("cannot raise the open file limit: {e}"));
    }
    let config = InstanceConfig {
        runtime_dir: Some(runtime_dir.to_owned()),
        description: publication::description(),
        ..Default::default()
    };
    let hv = Hypervisor::with_config(config)
        .with_context(|| format!("cannot publish the observer's instance under {}", runtime_dir.display()))?;
    if let Some(name) = hv.published_name() {
        log(&format!("observing every KVM VM on this host as instance {name}"));
    }
    let mark = Mark::leave(runtime_dir, &hv, &log);
    let cancel = Cancel::new();
    let options = ObserveOptions {
        claims: Some(runtime_dir.to_owned()),
        cancel: cancel.clone(),
        qmp_auto: !how.no_qmp,
        filter: how.filter,
        ..Default::default()
    };
    let mut observer = Observer::new(hv.clone(), Procfs::host(), Targets::All, options);
    let stop = cancel.clone();
    let thread = std::thread::Builder::new()
        .name("observer".into())
        .spawn(move || {
            let ended = Runner {
                observer: Some(&mut observer),
                hv: Some(&hv),
                mshv: None,
                interval: how.interval,
                cancel: &stop,
                log: &log,
            }
            .run();
            // An observer that stopped on its own stays published, saying so, until serve stops.
            if ended == Ended::Panicked {
                wait_for(&stop);
            }
            // The observer and the instance go here: partitions, claims, then the files. The
            // VMs go on, and so do their kept counts, for the next observer.
            observer.leave_kept_counts();
            drop(observer);
            drop::<Arc<Hypervisor>>(hv);
            drop(mark);
            drop(how.held);
        })
        .context("starting the observer thread")?;
    Ok(Running { cancel, thread })
}

/// Waits until `cancel` is set.
fn wait_for(cancel: &Cancel) {
    while !cancel.pause(std::time::Duration::from_secs(3600)) {}
}
