//! A partition's run: one thread per VP, and on the calling thread the collector that merges the
//! kernel sources into the pages on a cadence until every VP has stopped or the timeout passed.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hvstats_abi::boot::Mode;

use super::{Partition, RunReport, lock};
use crate::error::Error;
use crate::modes;
use crate::vp::{self, FaultCause, Refresh, RipSeen, VpEnv, VpFault, VpOutcome};

impl Partition {
    /// Asks a running (or about to run) [`Partition::run`] to stop every VP now, as when its
    /// timeout passes; safe from any thread, e.g. one that received SIGINT. The VPs that had not
    /// stopped are reported as stopped on request, with their RIP.
    pub fn stop(&self) {
        self.stop_requested.store(true, Ordering::SeqCst);
        for presence in self.space.vps() {
            presence.request_stop();
        }
    }

    /// Whether [`Partition::stop`] was called.
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop_requested.load(Ordering::SeqCst)
    }

    /// Starts every VP at `entry` and waits until all have stopped, the timeout has passed or
    /// [`Partition::stop`] was called.
    ///
    /// # Errors
    /// When the partition already ran, the entry point does not suit the mode, or a vCPU cannot be
    /// set up.
    pub fn run(&self, entry: u64) -> Result<RunReport, Error> {
        let vcpus = std::mem::take(&mut *lock(&self.vcpus));
        if vcpus.is_empty() {
            return Err(Error::AlreadyRan);
        }
        if self.config.mode == Mode::Real && entry >= 1 << 20 {
            return Err(Error::RealModeEntry { entry });
        }
        self.set_start_state(&vcpus, entry)?;
        let start = Instant::now();
        let deadline = start + self.config.timeout;
        let outcomes = std::thread::scope(|s| {
            let (done_tx, done_rx) = mpsc::channel::<usize>();
            let handles: Vec<_> = vcpus
                .into_iter()
                .zip(&self.vps)
                .enumerate()
                .map(|(i, (vcpu, shared))| {
                    let tx = done_tx.clone();
                    let env = self.vp_env(shared.index);
                    s.spawn(move || {
                        let outcome = vp::run(&env, shared, vcpu);
                        let _ = tx.send(i);
                        outcome
                    })
                })
                .collect();
            drop(done_tx);
            self.collect_until_stopped(&done_rx, handles.len(), deadline);
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| h.join().unwrap_or_else(|_| thread_panicked(i as u32)))
                .collect::<Vec<_>>()
        });
        // The VPs' final readings (their threads took the last thread times as they ended).
        for i in 0..self.config.vp_count {
            self.refresh_as(i, Refresh::Everything);
        }
        self.refresh_partition();
        Ok(RunReport { vps: outcomes, elapsed: start.elapsed() })
    }

    /// Puts every vCPU in the partition's mode at `entry`, runnable.
    fn set_start_state(&self, vcpus: &[kvm_ioctls::VcpuFd], entry: u64) -> Result<(), Error> {
        for (i, vcpu) in vcpus.iter().enumerate() {
            let mut sregs = vcpu.get_sregs().map_err(start_state(i, "KVM_GET_SREGS"))?;
            let regs =
                modes::initial_state(self.config.mode, &mut sregs, entry, i as u32, self.config.vp_count);
            vcpu.set_sregs(&sregs).map_err(start_state(i, "KVM_SET_SREGS"))?;
            vcpu.set_regs(&regs).map_err(start_state(i, "KVM_SET_REGS"))?;
            // With the in-kernel irqchip, APs wait for INIT/SIPI; every VP starts running here.
            let runnable = kvm_bindings::kvm_mp_state { mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE };
            vcpu.set_mp_state(runnable).map_err(start_state(i, "KVM_SET_MP_STATE"))?;
        }
        Ok(())
    }

    /// What VP `index`'s thread needs of the partition.
    fn vp_env(&self, index: u32) -> VpEnv<'_> {
        VpEnv {
            page: self.stats.vp_page(index),
            stats: &self.stats,
            handlers: &self.handlers,
            space: &self.space,
            sync_regs: self.sync_regs,
            accounting: self.config.accounting,
            hardware: self.config.hardware_counters.as_ref(),
            stop_requested: &self.stop_requested,
            missing: &self.missing,
        }
    }

    /// Waits for `running` VPs to report on `done`, merging every source into the pages each
    /// collect interval; past `deadline` asks every VP to stop (and kicks it) until all have.
    fn collect_until_stopped(&self, done: &mpsc::Receiver<usize>, running: usize, deadline: Instant) {
        let mut remaining = running;
        let mut next_collect = Instant::now() + self.config.collect_interval;
        let mut stopping = false;
        while remaining > 0 {
            let now = Instant::now();
            if !stopping && (now >= deadline || self.stop_requested()) {
                stopping = true;
            }
            if stopping {
                for presence in self.space.vps() {
                    presence.request_stop();
                }
            }
            let wake = if stopping { now + Duration::from_millis(20) } else { next_collect.min(deadline) };
            match done.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(_) => remaining -= 1,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if Instant::now() >= next_collect {
                for i in 0..self.config.vp_count {
                    self.refresh_as(i, Refresh::Everything);
                }
                self.refresh_partition();
                // The LP pages' writer is whoever collects; a host without procfs keeps them.
                let _ = self.hv.refresh_lps();
                next_collect = Instant::now() + self.config.collect_interval;
            }
        }
    }
}

/// The error of setting vCPU `vp`'s start state with `ioctl`.
fn start_state(vp: usize, ioctl: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::StartState { vp: vp as u32, ioctl, source }
}

/// The outcome of VP `index` whose thread panicked: nothing it measured is known.
fn thread_panicked(index: u32) -> VpOutcome {
    let fault = VpFault { cause: FaultCause::ThreadPanicked, rip: 0, rip_seen: RipSeen::Unknown };
    VpOutcome { index, fault: Some(fault), ..VpOutcome::default() }
}
