//! The page reader on hostile input: 100k random pages and 100k mutated valid pages, each fed to
//! the body of the `page_reader` fuzz target, which checks that the reader returns values that
//! agree with the bytes or an error naming a place in the page — and never panics.
//!
//! A small deterministic generator (splitmix64) keeps the run reproducible and dependency-free.

// Test and bench set-up: a failed step is the run's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../fuzz/src/page_reader.rs"]
#[allow(missing_docs)]
mod page_reader;

use hvstats_abi::catalog::counters_of;
use hvstats_abi::group::{GroupHeader, GroupType, GroupVersion, PAGE_SIZE};
use hvstats_abi::page::{PageBuilder, PageLayout, StatsPage};
use hvstats_abi::{GroupKind, ObjectKind};
use page_reader::{Verdict, check, check_page};
use zerocopy::IntoBytes;

const PAGES: usize = 100_000;

/// splitmix64: a tiny, good-enough, reproducible generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Tallies outcomes so a run that never reaches the interesting paths fails.
#[derive(Default, Debug)]
struct Tally {
    walk_ok: usize,
    walk_err: usize,
    read_ok: usize,
    read_err: usize,
    inferred: usize,
}

impl Tally {
    fn add(&mut self, v: &Verdict) {
        if v.walk.is_ok() {
            self.walk_ok += 1
        } else {
            self.walk_err += 1
        }
        self.read_ok += v.read.iter().filter(|r| r.is_ok()).count();
        self.read_err += v.read.iter().filter(|r| r.is_err()).count();
        self.inferred += usize::from(v.inferred.is_some());
    }
}

fn header_bytes(t: u16, major: u16, minor: u16, length: u16) -> [u8; 8] {
    let mut h = [0u8; 8];
    h.copy_from_slice(GroupHeader::new(GroupType(t), GroupVersion { major, minor }, length).as_bytes());
    h
}

/// A random page: half plain random bytes, half a random chain of plausible headers (so the walk
/// gets past the first group), with random lengths and terminators.
fn random_page(rng: &mut Rng) -> [u8; PAGE_SIZE] {
    let mut words = [0u64; PAGE_SIZE / 8];
    for w in &mut words {
        *w = rng.next();
    }
    let mut page = [0u8; PAGE_SIZE];
    page.copy_from_slice(words.as_bytes());
    if rng.chance(2) {
        return page;
    }
    let mut at = 0;
    while at + 8 <= PAGE_SIZE {
        let t = [0, 1, 2, 3, 7, 14, 15, rng.next() as u16][rng.below(8)];
        let major = [0, 1, 1, 1, 2, rng.next() as u16][rng.below(6)];
        let minor = [0, 0, 1, rng.next() as u16][rng.below(4)];
        let counters = [0, 1, 2, 5, 7, 18, 63, 64, rng.below(520)][rng.below(9)];
        let mut length = (counters * 8) as u16;
        if rng.chance(10) {
            length = rng.next() as u16;
        }
        let (major, minor, length) =
            if t <= 1 && !rng.chance(10) { (0, 0, 0) } else { (major, minor, length) };
        page[at..at + 8].copy_from_slice(&header_bytes(t, major, minor, length));
        if t <= 1 {
            break;
        }
        at += 8 + length as usize;
    }
    page
}

/// A valid page of a random kind with random values, then damaged: bytes flipped, a header's
/// length, type or version changed, groups cut short or the terminator moved.
fn mutated_page(rng: &mut Rng) -> [u8; PAGE_SIZE] {
    let kind = ObjectKind::ALL[rng.below(4)];
    let layout = PageLayout::of(kind);
    let mut page = if rng.chance(4) {
        // A newer minor: longer groups plus an unknown group.
        let mut b = PageBuilder::new();
        for slot in layout.slots() {
            let values: Vec<u64> = (0..slot.counters + rng.below(8)).map(|_| rng.next()).collect();
            let minor = rng.below(3) as u16;
            b.group(slot.group.group_type(), GroupVersion { major: 1, minor }, &values).unwrap();
        }
        b.group(GroupType(7 + rng.below(8) as u16), GroupVersion::V1_0, &[rng.next(); 3]).unwrap();
        b.finish()
    } else {
        let mut p = StatsPage::new(kind);
        for c in counters_of(kind) {
            p.set(c.id, rng.next());
        }
        p
    };
    let bytes = page.data.as_mut_bytes();
    let headers: Vec<usize> = layout.slots().map(|s| s.header_offset).chain([layout.end_offset]).collect();
    for _ in 0..1 + rng.below(3) {
        let h = headers[rng.below(headers.len())];
        match rng.below(8) {
            // Flip a random bit anywhere in the used part of the page.
            0 => bytes[rng.below(layout.end_offset + 8)] ^= 1 << rng.below(8),
            // A random byte anywhere.
            1 => bytes[rng.below(PAGE_SIZE)] = rng.next() as u8,
            // A header's length: random, off by one, or by a counter.
            2 => {
                let len = u16::from_le_bytes([bytes[h + 6], bytes[h + 7]]);
                let new = match rng.below(4) {
                    0 => rng.next() as u16,
                    1 => len.wrapping_add(1),
                    2 => len.wrapping_sub(8),
                    _ => len.wrapping_add(8),
                };
                bytes[h + 6..h + 8].copy_from_slice(&new.to_le_bytes());
            }
            // A header's type.
            3 => {
                let t = [0u16, 1, 2, 3, 7, 14, 15, rng.next() as u16][rng.below(8)];
                bytes[h..h + 2].copy_from_slice(&t.to_le_bytes());
            }
            // A header's major or minor.
            4 => {
                let at = h + 2 + 2 * rng.below(2);
                let v = [0u16, 1, 2, rng.next() as u16][rng.below(4)];
                bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
            // Move END_OF_LIST away (the page then runs on into zeros or garbage).
            5 => bytes[layout.end_offset..layout.end_offset + 8].copy_from_slice(&header_bytes(9, 1, 0, 8)),
            // Fill the rest of the page with garbage after the terminator (must be ignored).
            6 => {
                for chunk in bytes[layout.end_offset + 8..].chunks_mut(8) {
                    chunk.copy_from_slice(&rng.next().to_le_bytes());
                }
            }
            // Swap a group header with END_OF_PAGE.
            _ => bytes[h..h + 8].copy_from_slice(&header_bytes(1, 0, 0, 0)),
        }
    }
    let mut out = [0u8; PAGE_SIZE];
    out.copy_from_slice(bytes);
    out
}

#[test]
fn random_pages_give_errors_or_values_never_panics() {
    let mut rng = Rng(0x5EED_0001);
    let mut tally = Tally::default();
    for _ in 0..PAGES {
        tally.add(&check_page(&random_page(&mut rng)));
    }
    assert!(tally.walk_ok > 1000 && tally.walk_err > 1000, "{tally:?}");
    assert!(tally.read_err > PAGES, "{tally:?}");
}

#[test]
fn mutated_valid_pages_give_errors_or_values_never_panics() {
    let mut rng = Rng(0x5EED_0002);
    let mut tally = Tally::default();
    for _ in 0..PAGES {
        tally.add(&check_page(&mutated_page(&mut rng)));
    }
    // Both outcomes are reached in quantity: the mutations are neither all harmless nor all fatal.
    assert!(tally.read_ok > PAGES / 10 && tally.read_err > PAGES, "{tally:?}");
    assert!(tally.inferred > PAGES / 10 && tally.walk_err > PAGES / 10, "{tally:?}");
}

#[test]
fn valid_pages_of_every_kind_read_as_that_kind() {
    let mut rng = Rng(0x5EED_0003);
    for kind in ObjectKind::ALL {
        let mut page = StatsPage::new(kind);
        for c in counters_of(kind) {
            page.set(c.id, rng.next());
        }
        let v = check(page.as_bytes());
        assert_eq!(v.inferred, Some(kind));
        assert!(v.read[kind as usize].is_ok());
        assert_eq!(v.walk, Ok(PageLayout::of(kind).slots().count()));
        let groups =
            GroupKind::ALL.iter().filter(|&&g| PageLayout::of(kind).group_offset(g).is_some()).count();
        assert_eq!(v.walk, Ok(groups));
    }
}

#[test]
fn inputs_of_any_length_are_refused_or_read_as_a_page() {
    let mut rng = Rng(0x5EED_0004);
    let valid = StatsPage::new(ObjectKind::Vp);
    for len in [0, 1, 7, 8, 100, 4095, 4097, 8192] {
        let mut data: Vec<u8> = valid.as_bytes().iter().copied().cycle().take(len).collect();
        check(&data);
        for b in &mut data {
            *b = rng.next() as u8;
        }
        check(&data);
    }
}
