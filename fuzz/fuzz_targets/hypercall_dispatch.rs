//! Fuzzes the stats hypercall dispatcher: sequences of hypercalls from a guest VP or the root over
//! fake guest RAM and a fake overlay hook.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    hvstats_fuzz::hypercall_dispatch::check(data);
});
