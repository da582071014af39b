//! The stats overlays of one caller's GPA space: which object is mapped at which GPA page.
//!
//! A guest partition's GPA space is RAM plus the stats pages it mapped with HvCallMapStatsPage.
//! This module keeps that bookkeeping for the authority (the backend only installs and removes the
//! read-only overlay), so it can answer "is GPA X an overlay?" when a guest writes there, and the
//! partition's "GPA pages" counter can count overlays that add a page outside RAM.

use std::ops::Range;

use hvstats_abi::PAGE_SIZE;

use crate::rules::{MappingTable, ObjectKey};

/// Where one mapped stats page lies in the caller's GPA space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverlayMapping {
    /// The GPA page number the caller asked for.
    pub gpa_page: u64,
    /// False when the page lies beyond the GPA space: the call succeeded but nothing is visible.
    pub accessible: bool,
    /// True when the overlay lies outside guest RAM (it adds a page to the GPA space).
    pub outside_ram: bool,
}

/// The stats pages mapped into one caller's GPA space, and its RAM size.
#[derive(Debug)]
pub struct GpaSpace {
    mappings: MappingTable<OverlayMapping>,
    ram_pages: u64,
    detached: bool,
}

impl GpaSpace {
    /// An empty GPA space allowing `quota` stats pages.
    pub fn new(quota: u32) -> Self {
        Self { mappings: MappingTable::new(quota), ram_pages: 0, detached: false }
    }

    /// The mapped stats pages.
    pub fn mappings(&self) -> &MappingTable<OverlayMapping> {
        &self.mappings
    }

    /// The mapped stats pages, to change.
    pub(crate) fn mappings_mut(&mut self) -> &mut MappingTable<OverlayMapping> {
        &mut self.mappings
    }

    /// The object whose page is visible at `gpa`, if any.
    pub fn overlay_at(&self, gpa: u64) -> Option<ObjectKey> {
        let page = gpa / PAGE_SIZE as u64;
        self.mappings.iter().find(|(_, m)| m.accessible && m.gpa_page == page).map(|(k, _)| *k)
    }

    /// Pages of guest RAM.
    pub fn ram_pages(&self) -> u64 {
        self.ram_pages
    }

    pub(crate) fn set_ram_pages(&mut self, pages: u64) -> u64 {
        std::mem::replace(&mut self.ram_pages, pages)
    }

    /// Pages present in the GPA space: RAM plus visible overlays lying outside RAM.
    pub fn gpa_pages(&self) -> u64 {
        let outside = self.mappings.iter().filter(|(_, m)| m.accessible && m.outside_ram).count() as u64;
        self.ram_pages + outside
    }

    pub(crate) fn detached(&self) -> bool {
        self.detached
    }

    pub(crate) fn detach(&mut self) {
        self.detached = true;
    }
}

/// The pieces of a RAM region (GPA page numbers) left visible around overlay pages: what a
/// backend whose memory slots cannot overlap (KVM) maps as RAM, each overlay page getting a
/// read-only slot of its own. `overlays` must be sorted; pages outside `ram` are ignored.
pub fn ram_pieces(ram: Range<u64>, overlays: &[u64]) -> Vec<Range<u64>> {
    let mut pieces = Vec::new();
    let mut start = ram.start;
    for &page in overlays.iter().filter(|p| ram.contains(p)) {
        if page > start {
            pieces.push(start..page);
        }
        start = start.max(page + 1);
    }
    if start < ram.end {
        pieces.push(start..ram.end);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_is_split_around_overlays() {
        assert_eq!(ram_pieces(0..16, &[]), vec![0..16]);
        assert_eq!(ram_pieces(0..16, &[5]), vec![0..5, 6..16]);
        assert_eq!(ram_pieces(0..16, &[0, 1, 15, 40]), vec![2..15]);
        assert_eq!(ram_pieces(0..16, &[5, 6, 9]), vec![0..5, 7..9, 10..16]);
        assert_eq!(ram_pieces(4..5, &[4]), Vec::<Range<u64>>::new());
    }
}
