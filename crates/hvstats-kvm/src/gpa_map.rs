//! The GPA map: which KVM memory slots make up a partition's guest physical address space.
//!
//! The map is guest RAM at GPA 0 plus read-only 4 KiB overlay pages (stats pages a guest maps). An
//! overlay inside RAM hides the RAM page under it: the RAM slot is split around it, and restored
//! when the overlay goes. Each change is computed as the wanted list of regions, diffed against the
//! slots KVM has, and applied slot by slot; every slot created or deleted is one GPA space
//! modification.

use std::collections::BTreeMap;

use kvm_bindings::{KVM_MEM_READONLY, kvm_userspace_memory_region};
use kvm_ioctls::VmFd;

use crate::error::Error;

const PAGE: u64 = 4096;

/// One memory slot's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    gpa: u64,
    size: u64,
    host: u64,
    readonly: bool,
}

/// The slots of one VM.
#[derive(Debug)]
pub struct GpaMap {
    ram_host: u64,
    ram_size: u64,
    overlays: BTreeMap<u64, u64>,
    slots: BTreeMap<u32, Region>,
    modifications: u64,
}

impl GpaMap {
    /// Registers guest RAM (`ram_size` bytes at host address `ram_host`) at GPA 0.
    ///
    /// # Errors
    /// When KVM refuses the slot.
    pub fn new(vm: &VmFd, ram_host: u64, ram_size: u64) -> Result<Self, Error> {
        let mut map =
            Self { ram_host, ram_size, overlays: BTreeMap::new(), slots: BTreeMap::new(), modifications: 0 };
        map.apply(vm)?;
        Ok(map)
    }

    /// Pages present in the GPA space: RAM pages not hidden by an overlay, plus overlays.
    pub fn gpa_pages(&self) -> u64 {
        self.slots.values().map(|r| r.size / PAGE).sum()
    }

    /// Memory slot changes so far (creations and deletions).
    pub fn modifications(&self) -> u64 {
        self.modifications
    }

    /// KVM slots in use.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Maps the 4 KiB page at host address `host` read-only at GPA page `gpa_page`.
    ///
    /// # Errors
    /// When the page already has an overlay, the address is unaligned or KVM refuses a slot.
    pub fn add_overlay(&mut self, vm: &VmFd, gpa_page: u64, host: u64) -> Result<(), Error> {
        if !host.is_multiple_of(PAGE) {
            return Err(Error::Overlay { gpa_page, why: "host page is not 4 KiB aligned" });
        }
        if gpa_page.checked_mul(PAGE).is_none_or(|g| g >= 1 << 52) {
            return Err(Error::Overlay { gpa_page, why: "beyond the guest physical address width" });
        }
        if self.overlays.contains_key(&gpa_page) {
            return Err(Error::Overlay { gpa_page, why: "already mapped" });
        }
        self.overlays.insert(gpa_page, host);
        if let Err(e) = self.apply(vm) {
            self.overlays.remove(&gpa_page);
            let _ = self.apply(vm);
            return Err(e);
        }
        Ok(())
    }

    /// Removes the overlay at GPA page `gpa_page`, showing what was under it again.
    ///
    /// # Errors
    /// When no overlay is there or KVM refuses a slot change.
    pub fn remove_overlay(&mut self, vm: &VmFd, gpa_page: u64) -> Result<(), Error> {
        if self.overlays.remove(&gpa_page).is_none() {
            return Err(Error::Overlay { gpa_page, why: "not mapped" });
        }
        self.apply(vm)
    }

    fn wanted(&self) -> Vec<Region> {
        let mut out = Vec::new();
        let mut cursor = 0u64;
        for (&page, &host) in &self.overlays {
            let gpa = page * PAGE;
            if gpa < self.ram_size {
                if gpa > cursor {
                    out.push(Region {
                        gpa: cursor,
                        size: gpa - cursor,
                        host: self.ram_host + cursor,
                        readonly: false,
                    });
                }
                cursor = gpa + PAGE;
            }
            out.push(Region { gpa, size: PAGE, host, readonly: true });
        }
        if cursor < self.ram_size {
            out.push(Region {
                gpa: cursor,
                size: self.ram_size - cursor,
                host: self.ram_host + cursor,
                readonly: false,
            });
        }
        out
    }

    fn apply(&mut self, vm: &VmFd) -> Result<(), Error> {
        let wanted = self.wanted();
        let stale: Vec<u32> =
            self.slots.iter().filter(|(_, r)| !wanted.contains(r)).map(|(&slot, _)| slot).collect();
        for slot in stale {
            if let Some(r) = self.slots.get(&slot).copied() {
                set_slot(vm, slot, Region { size: 0, ..r })?;
                self.slots.remove(&slot);
                self.modifications += 1;
            }
        }
        for r in wanted {
            if self.slots.values().any(|have| *have == r) {
                continue;
            }
            let slot = (0u32..).find(|s| !self.slots.contains_key(s)).unwrap_or(0);
            set_slot(vm, slot, r)?;
            self.slots.insert(slot, r);
            self.modifications += 1;
        }
        Ok(())
    }
}

fn set_slot(vm: &VmFd, slot: u32, r: Region) -> Result<(), Error> {
    let region = kvm_userspace_memory_region {
        slot,
        flags: if r.readonly { KVM_MEM_READONLY } else { 0 },
        guest_phys_addr: r.gpa,
        memory_size: r.size,
        userspace_addr: r.host,
    };
    // SAFETY: the host range is our guest RAM mapping or a page mapping the caller keeps alive
    // while the overlay exists (see `Partition::add_overlay`); deleting uses size 0.
    unsafe { vm.set_user_memory_region(region) }.map_err(|source| Error::SetMemorySlot { slot, source })
}
