//! The guest physical address space of a partition, and the VPs it must hold out of the guest
//! while it changes.
//!
//! A guest must never see a memory slot missing: a change of the slots (a stats page mapped or
//! unmapped by a hypercall, or by the host) closes the [`GuestGate`], kicks every VP out of
//! KVM_RUN and applies the change with none inside. The space owns what that takes: the VM fd,
//! guest RAM, the GPA map with its overlays, the gate and each VP's presence (whether it is in
//! KVM_RUN, and how to kick it). Handlers reach guest memory through it, not through the whole
//! partition.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use kvm_ioctls::VmFd;

use crate::error::Error;
use crate::gpa_map::GpaMap;
use crate::memory::GuestRam;
use hvstats_host::os as sys;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps VPs out of the guest while the partition changes its memory slots.
///
/// A changer closes the gate, kicks every VP that is in KVM_RUN and waits until none is; a VP
/// sets its `in_guest` flag before looking at the gate (both sequentially consistent), so either
/// the changer sees the flag and waits for it, or the VP sees the gate closed and waits.
#[derive(Debug, Default)]
pub(crate) struct GuestGate {
    closed: AtomicBool,
    changer: Mutex<()>,
    opened: Condvar,
    waiters: Mutex<()>,
}

impl GuestGate {
    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    pub(crate) fn wait_open(&self, stop: impl Fn() -> bool) {
        let mut g = lock(&self.waiters);
        while self.closed() && !stop() {
            g = self
                .opened
                .wait_timeout(g, Duration::from_millis(10))
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Runs `change` with no VP in the guest. The VP calling this (from a handler) is not in the
    /// guest, so it may.
    pub(crate) fn exclusive<T>(&self, vps: &[VpPresence], change: impl FnOnce() -> T) -> T {
        let _changer = lock(&self.changer);
        self.closed.store(true, Ordering::SeqCst);
        // Kicked VPs leave KVM_RUN within microseconds; the bound only keeps a broken kick from
        // hanging the host.
        let deadline = Instant::now() + Duration::from_secs(2);
        while vps.iter().any(VpPresence::in_guest) && Instant::now() < deadline {
            for vp in vps.iter().filter(|vp| vp.in_guest()) {
                vp.kick();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let result = change();
        {
            let _w = lock(&self.waiters);
            self.closed.store(false, Ordering::SeqCst);
        }
        self.opened.notify_all();
        result
    }
}

/// Where to kick a running VP thread.
#[derive(Debug, Default)]
struct KickTarget {
    live: bool,
    thread: libc::pthread_t,
    run: usize,
}

/// Whether a VP is in the guest, whether it was asked to stop, and how to kick it out of KVM_RUN.
#[derive(Debug, Default)]
pub(crate) struct VpPresence {
    stop: AtomicBool,
    /// True while the thread is in (or about to enter) KVM_RUN; see [`GuestGate`].
    in_guest: AtomicBool,
    kick: Mutex<KickTarget>,
}

/// The signal that interrupts KVM_RUN; its handler does nothing.
fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

extern "C" fn on_kick(_: libc::c_int) {}

/// Installs the kick signal's handler once per process. Without it the signal would end the
/// process, so a failure is an error of every partition.
///
/// # Errors
/// When sigaction refuses the handler.
pub(crate) fn install_kick_handler() -> Result<(), Error> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler does
        // nothing (async-signal-safe) and there is no SA_RESTART, so KVM_RUN returns EINTR.
        let result = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_kick as *const () as usize;
            sys::check(libc::sigemptyset(&mut sa.sa_mask))
                .and_then(|_| sys::check(libc::sigaction(kick_signal(), &sa, std::ptr::null_mut())))
        };
        result.map(drop).map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))
    });
    installed.map_err(|errno| Error::KickHandler(std::io::Error::from_raw_os_error(errno)))
}

impl VpPresence {
    /// Asks the VP to stop and kicks it out of KVM_RUN. Safe to repeat.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kick();
    }

    /// True once the VP was asked to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Makes KVM_RUN return (now, or at once when it is next entered) without stopping the VP.
    pub(crate) fn kick(&self) {
        let k = lock(&self.kick);
        if k.live {
            // SAFETY: `run` is the vCPU's kvm_run mapping, alive while `live` is set (the VP thread
            // clears it under this lock before dropping the vCPU). A volatile byte store is what
            // KVM expects of immediate_exit.
            unsafe {
                let run = k.run as *mut kvm_bindings::kvm_run;
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*run).immediate_exit), 1);
            }
            // SAFETY: `thread` is the VP thread's pthread_t; it is not joined while `live` is set.
            // A failure (the thread is already gone) leaves nothing to kick.
            let _ = sys::check_errno(unsafe { libc::pthread_kill(k.thread, kick_signal()) });
        }
    }

    /// Registers the calling thread, running the vCPU whose `kvm_run` is at `run`, as the one to
    /// kick until [`leave`](Self::leave).
    pub(crate) fn enter(&self, run: *mut kvm_bindings::kvm_run) {
        let mut k = lock(&self.kick);
        // SAFETY: pthread_self has no preconditions.
        k.thread = unsafe { libc::pthread_self() };
        k.run = run as usize;
        k.live = true;
    }

    /// The VP thread is about to drop its vCPU: nothing to kick any more.
    pub(crate) fn leave(&self) {
        lock(&self.kick).live = false;
    }

    /// True while the VP thread is inside KVM_RUN (or about to enter it).
    pub(crate) fn in_guest(&self) -> bool {
        self.in_guest.load(Ordering::SeqCst)
    }

    /// Marks the VP as entering KVM_RUN, unless the gate is closed: then it waits until the gate
    /// opens or the VP is asked to stop. Returns false when it should stop instead.
    pub(crate) fn enter_guest(&self, gate: &GuestGate) -> bool {
        loop {
            self.in_guest.store(true, Ordering::SeqCst);
            if !gate.closed() {
                return true;
            }
            self.in_guest.store(false, Ordering::SeqCst);
            gate.wait_open(|| self.stopping());
            if self.stopping() {
                return false;
            }
        }
    }

    /// Marks the VP as out of KVM_RUN.
    pub(crate) fn left_guest(&self) {
        self.in_guest.store(false, Ordering::SeqCst);
    }
}

/// A page a guest can see read-only through an overlay; it must stay mapped while the overlay
/// exists, which holding it in an `Arc` guarantees.
pub trait OverlayBacking: Send + Sync {
    /// Host address of the 4 KiB page.
    fn host_address(&self) -> u64;
}

/// A partition's guest physical address space: RAM and stats overlays in KVM memory slots.
pub struct GuestSpace {
    // Field order is drop order: the VM goes before the RAM and overlays it maps.
    gpa_map: Mutex<GpaMap>,
    vm: VmFd,
    overlays: Mutex<HashMap<u64, Arc<dyn OverlayBacking>>>,
    ram: GuestRam,
    gate: GuestGate,
    vps: Vec<VpPresence>,
}

impl GuestSpace {
    /// RAM registered at GPA 0 of `vm`, for `vp_count` VPs.
    pub(crate) fn new(vm: VmFd, ram: GuestRam, vp_count: u32) -> Result<Self, Error> {
        let gpa_map = GpaMap::new(&vm, ram.host_address(), ram.size())?;
        Ok(Self {
            gpa_map: Mutex::new(gpa_map),
            vm,
            overlays: Mutex::new(HashMap::new()),
            ram,
            gate: GuestGate::default(),
            vps: (0..vp_count).map(|_| VpPresence::default()).collect(),
        })
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    pub(crate) fn vm(&self) -> &VmFd {
        &self.vm
    }

    pub(crate) fn gate(&self) -> &GuestGate {
        &self.gate
    }

    /// The presence of VP `index`.
    pub(crate) fn vp(&self, index: u32) -> Option<&VpPresence> {
        self.vps.get(index as usize)
    }

    pub(crate) fn vps(&self) -> &[VpPresence] {
        &self.vps
    }

    /// Shows `page` read-only at GPA page `gpa_page` (over RAM, or outside it). A guest write to it
    /// exits to userspace as an MMIO write and leaves the page unchanged. Running VPs are held out
    /// of the guest while the slots change, so none sees RAM missing; a handler may call this.
    ///
    /// # Errors
    /// When an overlay is already there or KVM refuses the slot change.
    pub fn add_overlay(&self, gpa_page: u64, page: Arc<dyn OverlayBacking>) -> Result<(), Error> {
        let mut overlays = lock(&self.overlays);
        self.gate.exclusive(&self.vps, || {
            lock(&self.gpa_map).add_overlay(&self.vm, gpa_page, page.host_address())
        })?;
        overlays.insert(gpa_page, page);
        Ok(())
    }

    /// Removes the overlay at GPA page `gpa_page`; RAM under it shows again.
    ///
    /// # Errors
    /// When there is no overlay there or KVM refuses the slot change.
    pub fn remove_overlay(&self, gpa_page: u64) -> Result<(), Error> {
        let mut overlays = lock(&self.overlays);
        self.gate.exclusive(&self.vps, || lock(&self.gpa_map).remove_overlay(&self.vm, gpa_page))?;
        overlays.remove(&gpa_page);
        Ok(())
    }

    /// KVM memory slots in use (RAM pieces and overlays).
    pub fn memory_slots(&self) -> usize {
        lock(&self.gpa_map).slot_count()
    }

    /// KVM memory slots created or deleted so far.
    pub fn memory_slot_changes(&self) -> u64 {
        lock(&self.gpa_map).modifications()
    }

    /// Pages KVM maps for the guest: RAM not hidden by an overlay, plus overlays.
    pub fn mapped_pages(&self) -> u64 {
        lock(&self.gpa_map).gpa_pages()
    }
}

impl std::fmt::Debug for GuestSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No locks taken: a Debug print must never wait for (or deadlock with) a slot change.
        f.debug_struct("GuestSpace").field("ram_bytes", &self.ram.size()).finish_non_exhaustive()
    }
}
