//! The sequence counter under a real concurrent writer: every consistent copy is from one moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hvstats_abi::seqcount::{self, SeqRead, SeqWrite};

/// Values one write sets together (the size of a large merge).
const VALUES: usize = 64;

#[test]
fn readers_racing_a_writer_only_ever_see_whole_writes() {
    let shared: Arc<(AtomicU64, [AtomicU64; VALUES])> =
        Arc::new((AtomicU64::new(0), std::array::from_fn(|_| AtomicU64::new(0))));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut generation = 0u64;
            while !stop.load(Ordering::Relaxed) {
                generation += 1;
                let w = SeqWrite::begin(&shared.0);
                // Each value of a write is the generation, stored one at a time.
                {
                    let _w = w;
                    for v in &shared.1 {
                        v.store(generation, Ordering::Relaxed);
                    }
                }
                // Writes come at a cadence, not back to back (a reader needs a quiet moment).
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            generation
        })
    };
    let (mut consistent, mut torn, mut last_seen) = (0u64, 0u64, 0u64);
    while consistent < 5_000 {
        let copy = || -> [u64; VALUES] { std::array::from_fn(|i| shared.1[i].load(Ordering::Relaxed)) };
        match seqcount::read(&shared.0, 4, copy) {
            SeqRead::Consistent { value, sequence } => {
                assert!(value.iter().all(|&v| v == value[0]), "a consistent copy mixes writes: {value:?}");
                // Each finished write adds two to the sequence, so it names the generation.
                assert_eq!(value[0], sequence / 2, "sequence {sequence}");
                assert!(value[0] >= last_seen, "went back from {last_seen} to {}", value[0]);
                last_seen = value[0];
                consistent += 1;
            }
            SeqRead::Torn { tries, .. } => {
                assert_eq!(tries, 4);
                torn += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 0 && last_seen <= writes);
    eprintln!("{consistent} consistent copies, {torn} torn after 4 tries, {writes} writes");
}
