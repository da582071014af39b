//! The sequence counter under a real concurrent writer: every consistent copy is from one moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hvstats_abi::seqcount::{self, SeqRead, SeqWrite};

/// Values one write sets together (the size of a large merge).
const VALUES: usize = 64;
/// Consistent copies the reader takes, at least.
const COPIES: u64 = 5_000;
/// Distinct writes the reader must have seen whole before it stops, so that it raced a writer
/// that was writing rather than one that had not started yet.
const WRITES_SEEN: usize = 200;
/// How long the race may take on the slowest host before it is a failure.
const DEADLINE: Duration = Duration::from_secs(120);

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
                std::thread::sleep(Duration::from_micros(20));
            }
            generation
        })
    };
    let (mut consistent, mut torn, mut last_seen) = (0u64, 0u64, 0u64);
    // Generations seen whole, each counted once; the reader goes on until it has seen enough of
    // them, however fast it is beside the writer.
    let mut seen = 0usize;
    let deadline = Instant::now() + DEADLINE;
    while consistent < COPIES || seen < WRITES_SEEN {
        assert!(
            Instant::now() < deadline,
            "after {DEADLINE:?}: {consistent} consistent copies, {seen} writes seen whole, {torn} torn"
        );
        let copy = || -> [u64; VALUES] { std::array::from_fn(|i| shared.1[i].load(Ordering::Relaxed)) };
        match seqcount::read(&shared.0, 4, copy) {
            SeqRead::Consistent { value, sequence } => {
                assert!(value.iter().all(|&v| v == value[0]), "a consistent copy mixes writes: {value:?}");
                // Each finished write adds two to the sequence, so it names the generation.
                assert_eq!(value[0], sequence / 2, "sequence {sequence}");
                assert!(value[0] >= last_seen, "went back from {last_seen} to {}", value[0]);
                if value[0] > last_seen {
                    seen += 1;
                }
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
    assert!(seen >= WRITES_SEEN && last_seen <= writes, "{seen} writes seen, last {last_seen} of {writes}");
    eprintln!(
        "{consistent} consistent copies ({seen} writes seen whole), {torn} torn after 4 tries, {writes} writes"
    );
}
