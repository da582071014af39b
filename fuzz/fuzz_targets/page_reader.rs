//! Fuzzes the stats page reader: the group walk, `PageView::read` as every object kind, and
//! `infer_kind`, on arbitrary bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    hvstats_fuzz::page_reader::check(data);
});
