//! `serve --observe-all`: the observer of `hvstats observe --all` running inside the exporter, so
//! one process on a host exports every KVM VM on it — the VMs of other processes (QEMU,
//! Firecracker, …) published as partitions of the observer's own instance, read by the exporter
//! like any other instance.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_kvm::observe::{ObserveOptions, Observer, Procfs, Targets, publication, raise_fd_limit};

use crate::cmd::observe::describe;

fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "hvstats serve: {line}");
}

/// Publishes an observer instance under `runtime_dir` and refreshes it every `interval` on its own
/// thread, for as long as the process runs.
///
/// # Errors
/// When the instance cannot be published or the thread cannot start.
pub fn start(runtime_dir: &Path, interval: Duration) -> anyhow::Result<()> {
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
    let mut observer = Observer::new(
        hv.clone(),
        Procfs::host(),
        Targets::All,
        ObserveOptions { claims: Some(runtime_dir.to_owned()), ..Default::default() },
    );
    std::thread::Builder::new()
        .name("observer".into())
        .spawn(move || {
            loop {
                // The instance's LP pages, as every instance keeps them; without procfs they stay.
                let _ = hv.refresh_lps();
                for event in observer.tick() {
                    log(&describe(&event));
                }
                std::thread::sleep(interval);
            }
        })
        .context("starting the observer thread")?;
    Ok(())
}
