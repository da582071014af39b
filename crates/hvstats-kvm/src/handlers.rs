//! Extension points of the run loop: who handles a port, an MSR or a hypercall that reaches
//! userspace.
//!
//! The run loop classifies each userspace exit, looks up the handler registered for its port or
//! MSR in [`Handlers`], and accounts the exit by the class the handler was registered with. The
//! built-in handlers are the exit port, the serial port and the sink port/MSR the workloads use; the
//! Hyper-V enlightenment registers its synthetic MSRs ([`MsrHandler`]) and its hypercall port
//! ([`HypercallHandler`]) the same way.

use std::collections::HashMap;
use std::sync::Arc;

use hvstats_abi::boot::{self as layout, SINK_MSR};
use kvm_bindings::{KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS, kvm_regs};
use kvm_ioctls::{SyncReg, VcpuFd};

use hvstats::PartitionStats;

use crate::guest_space::GuestSpace;
use crate::modes::EFER_LMA;

/// Why a handler stops its VP as a guest fault.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Reading or writing the VP's registers failed.
    #[error("{op}: {source}")]
    Registers {
        /// The ioctl.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Guest memory the handler needed is not there.
    #[error("guest memory")]
    Memory(#[source] crate::Error),
    /// An error of a handler outside this crate.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl HandlerError {
    /// An error of the register ioctl `op`, for `map_err`.
    pub fn registers(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Self {
        move |source| Self::Registers { op, source }
    }
}

/// What the run loop does after a port write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortAction {
    /// Re-enter the guest.
    Continue,
    /// Stop the VP with this exit status.
    Stop(u32),
}

/// The VP an exit happened on, as handlers see it.
pub struct VpContext<'a> {
    /// The VP's index.
    pub index: u32,
    /// The vCPU (registers can be read and written: the VP is not running). [`Self::regs`],
    /// [`Self::long_mode`] and [`Self::set_regs`] use the registers KVM synced into `kvm_run`
    /// when the partition syncs them, and the register ioctls otherwise.
    pub vcpu: &'a mut VcpuFd,
    /// The partition's guest physical address space: RAM and stats overlays.
    pub space: &'a GuestSpace,
    /// The partition's stats objects.
    pub stats: &'a PartitionStats,
    /// The VP's serial output so far.
    pub serial: &'a mut Vec<u8>,
}

impl VpContext<'_> {
    fn synced(&mut self, set: u32) -> bool {
        self.vcpu.get_kvm_run().kvm_valid_regs & u64::from(set) != 0
    }

    /// The general registers at this exit.
    ///
    /// # Errors
    /// KVM_GET_REGS failed.
    pub fn regs(&mut self) -> Result<kvm_regs, HandlerError> {
        if self.synced(KVM_SYNC_X86_REGS) {
            return Ok(self.vcpu.sync_regs_mut().regs);
        }
        self.vcpu.get_regs().map_err(HandlerError::registers("KVM_GET_REGS"))
    }

    /// Whether the VP is in long mode (EFER.LMA and CS.L) at this exit, rather than in a 32-bit
    /// (or 16-bit) mode. Read at every call: a guest can switch modes without an exit.
    ///
    /// # Errors
    /// KVM_GET_SREGS failed.
    pub fn long_mode(&mut self) -> Result<bool, HandlerError> {
        let (efer, cs_l) = if self.synced(KVM_SYNC_X86_SREGS) {
            let sregs = &self.vcpu.sync_regs_mut().sregs;
            (sregs.efer, sregs.cs.l)
        } else {
            let sregs = self.vcpu.get_sregs().map_err(HandlerError::registers("KVM_GET_SREGS"))?;
            (sregs.efer, sregs.cs.l)
        };
        Ok(efer & EFER_LMA != 0 && cs_l != 0)
    }

    /// Sets the general registers the VP resumes with.
    ///
    /// # Errors
    /// KVM_SET_REGS failed.
    pub fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), HandlerError> {
        if self.synced(KVM_SYNC_X86_REGS) {
            // KVM loads them at the next KVM_RUN, before it completes the exit's instruction (as
            // after KVM_SET_REGS), also when that KVM_RUN returns at once for immediate_exit.
            self.vcpu.sync_regs_mut().regs = *regs;
            self.vcpu.set_sync_dirty_reg(SyncReg::Register);
            return Ok(());
        }
        self.vcpu.set_regs(regs).map_err(HandlerError::registers("KVM_SET_REGS"))
    }
}

/// Handles port I/O that KVM passes to userspace.
pub trait PortHandler: Send + Sync {
    /// A guest `out` of `data` to `port`.
    ///
    /// # Errors
    /// An error that stops the VP as a guest fault.
    fn write(&self, vp: &mut VpContext<'_>, port: u16, data: &[u8]) -> Result<PortAction, HandlerError>;

    /// A guest `in` from `port`: fill `data`.
    ///
    /// # Errors
    /// An error that stops the VP as a guest fault.
    fn read(&self, vp: &mut VpContext<'_>, port: u16, data: &mut [u8]) -> Result<(), HandlerError>;
}

/// Handles MSR accesses that KVM passes to userspace (unknown or filtered MSRs).
pub trait MsrHandler: Send + Sync {
    /// RDMSR: the value, or `None` to inject #GP.
    fn read(&self, vp: &mut VpContext<'_>, msr: u32) -> Option<u64>;
    /// WRMSR: `false` injects #GP.
    fn write(&self, vp: &mut VpContext<'_>, msr: u32, value: u64) -> bool;
}

/// Handles a hypercall trapped through a port write (e.g. a hypercall page holding
/// `out imm8, al; ret`). The handler reads the hypercall registers with [`VpContext::regs`] and
/// writes RAX with [`VpContext::set_regs`].
/// The run loop has already merged the VP's kernel sources into its page.
pub trait HypercallHandler: Send + Sync {
    /// Whether a write to the handler's port is a hypercall now (e.g. only once the guest has
    /// enabled its hypercall page); when not, the write is an ordinary port write.
    fn accepts_hypercalls(&self) -> bool {
        true
    }

    /// Performs the hypercall.
    ///
    /// # Errors
    /// An error that stops the VP as a guest fault.
    fn hypercall(&self, vp: &mut VpContext<'_>) -> Result<(), HandlerError>;
}

/// The handlers of one partition.
#[derive(Clone, Default)]
pub struct Handlers {
    pub(crate) ports: HashMap<u16, Arc<dyn PortHandler>>,
    pub(crate) msrs: HashMap<u32, Arc<dyn MsrHandler>>,
    pub(crate) hypercall_ports: HashMap<u16, Arc<dyn HypercallHandler>>,
}

impl Handlers {
    /// The built-in handlers: exit port, serial port, sink port and sink MSR.
    pub fn builtin() -> Self {
        let mut h = Self::default();
        h.add_port(layout::EXIT_PORT, Arc::new(ExitPort));
        let serial: Arc<dyn PortHandler> = Arc::new(SerialPort);
        for port in layout::SERIAL_PORT..=layout::SERIAL_PORT + 7 {
            h.add_port(port, serial.clone());
        }
        h.add_port(layout::SINK_PORT, Arc::new(SinkPort));
        h.add_msr(SINK_MSR, Arc::new(SinkMsr));
        h
    }

    /// Routes `port` to `handler` (replacing any handler it had).
    pub fn add_port(&mut self, port: u16, handler: Arc<dyn PortHandler>) {
        self.ports.insert(port, handler);
    }

    /// Routes `msr` to `handler`.
    pub fn add_msr(&mut self, msr: u32, handler: Arc<dyn MsrHandler>) {
        self.msrs.insert(msr, handler);
    }

    /// Makes writes to `port` hypercalls handled by `handler` (counted as hypercalls, not I/O).
    pub fn add_hypercall_port(&mut self, port: u16, handler: Arc<dyn HypercallHandler>) {
        self.ports.remove(&port);
        self.hypercall_ports.insert(port, handler);
    }
}

/// Port 0xF4: the value written is the VP's exit status.
struct ExitPort;

impl PortHandler for ExitPort {
    fn write(&self, _: &mut VpContext<'_>, _: u16, data: &[u8]) -> Result<PortAction, HandlerError> {
        let mut v = [0u8; 4];
        let n = data.len().min(4);
        v[..n].copy_from_slice(&data[..n]);
        Ok(PortAction::Stop(u32::from_le_bytes(v)))
    }
    fn read(&self, _: &mut VpContext<'_>, _: u16, data: &mut [u8]) -> Result<(), HandlerError> {
        data.fill(0);
        Ok(())
    }
}

/// A 16550 at 0x3F8 reduced to what a polling guest needs: bytes written to THR are output, LSR
/// always says "transmitter empty".
struct SerialPort;

impl PortHandler for SerialPort {
    fn write(&self, vp: &mut VpContext<'_>, port: u16, data: &[u8]) -> Result<PortAction, HandlerError> {
        if port == layout::SERIAL_PORT && vp.serial.len() < 1 << 20 {
            vp.serial.extend_from_slice(data);
        }
        Ok(PortAction::Continue)
    }
    fn read(&self, _: &mut VpContext<'_>, port: u16, data: &mut [u8]) -> Result<(), HandlerError> {
        data.fill(0);
        if port == layout::SERIAL_PORT + 5 {
            data[0] = 0x60;
        }
        Ok(())
    }
}

/// The sink port: writes are dropped, reads give 0.
struct SinkPort;

impl PortHandler for SinkPort {
    fn write(&self, _: &mut VpContext<'_>, _: u16, _: &[u8]) -> Result<PortAction, HandlerError> {
        Ok(PortAction::Continue)
    }
    fn read(&self, _: &mut VpContext<'_>, _: u16, data: &mut [u8]) -> Result<(), HandlerError> {
        data.fill(0);
        Ok(())
    }
}

/// The sink MSR: reads give 0, writes are dropped.
struct SinkMsr;

impl MsrHandler for SinkMsr {
    fn read(&self, _: &mut VpContext<'_>, _: u32) -> Option<u64> {
        Some(0)
    }
    fn write(&self, _: &mut VpContext<'_>, _: u32, _: u64) -> bool {
        true
    }
}
