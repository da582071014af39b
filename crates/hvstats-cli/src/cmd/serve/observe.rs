//! `serve --observe-all`: the observer of `hvstats observe --all` running inside the exporter, so
//! one process on a host exports every KVM VM on it — the VMs of other processes (QEMU,
//! Firecracker, …) published as partitions of the observer's own instance, read by the exporter
//! like any other instance.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_kvm::observe::{ObserveOptions, Observer, Procfs, Targets, publication, raise_fd_limit};

use crate::cmd::observe::describe;

use super::http::log;

/// The observer running on its own thread; [`stop`](Self::stop) ends it and removes its instance.
#[derive(Debug)]
pub struct Running {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    /// Stops the observer within one refresh's work, and waits for it to remove its instance.
    pub fn stop(self) {
        let _ = self.stop.send(());
        if self.thread.join().is_err() {
            log("the observer thread panicked");
        }
    }
}

/// Publishes an observer instance under `runtime_dir` and refreshes it every `interval` on its own
/// thread, until [`Running::stop`].
///
/// # Errors
/// When the instance cannot be published or the thread cannot start.
pub fn start(runtime_dir: &Path, interval: Duration) -> anyhow::Result<Running> {
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
    let mut observer = Observer::new(hv.clone(), Procfs::host(), Targets::All, ObserveOptions { qmp: None });
    let (stop, stopped) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("observer".into())
        .spawn(move || {
            loop {
                // The instance's LP pages, as every instance keeps them; without procfs they stay.
                let _ = hv.refresh_lps();
                for event in observer.tick() {
                    log(&describe(&event));
                }
                match stopped.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    // Asked to stop, or the exporter is gone: the instance goes with the observer.
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            drop(observer);
            drop(hv);
        })
        .context("starting the observer thread")?;
    Ok(Running { stop, thread })
}
