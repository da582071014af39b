//! The histograms of a VP page against what feeds them, without KVM: the run loop's exits of
//! known duration, and KVM's own log2 histograms read from a statistics file laid out as the
//! kernel lays out `KVM_GET_STATS_FD`.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use hvstats::SharedPage;
use hvstats_abi::catalog::vp;
use hvstats_abi::histogram::{BUCKETS, bucket_of};
use hvstats_abi::page::PageView;
use hvstats_abi::{CounterId, ObjectKind};
use zerocopy::IntoBytes;

use crate::accounting::{ExitAccounting, UserExit};
use crate::cycles;
use hvstats_sources::kvm_stats::KvmStats;
use hvstats_sources::user_exits::UserExitCounts;
use hvstats_sources::vcpu_stats::VcpuStats;

/// KVM's descriptor flags: cumulative or log2 histogram, in seconds.
const CUMULATIVE_SECONDS: u32 = 0x20;
const LOG_HIST_SECONDS: u32 = 0x04 | 0x20;

/// A statistics file with `stats` as (name, flags, values), nanosecond exponent.
fn stats_file(stats: &[(&str, u32, &[u64])]) -> std::fs::File {
    const NAME_SIZE: usize = 48;
    let (header, desc_fixed) = (24usize, 16usize);
    let desc_offset = header + NAME_SIZE;
    let data_offset = desc_offset + stats.len() * (desc_fixed + NAME_SIZE);
    let mut bytes = Vec::new();
    for word in [0, NAME_SIZE, stats.len(), header, desc_offset, data_offset] {
        bytes.extend_from_slice(&(word as u32).to_le_bytes());
    }
    let mut id = b"kvm-test/vcpu-0".to_vec();
    id.resize(NAME_SIZE, 0);
    bytes.extend_from_slice(&id);
    let mut offset = 0usize;
    for (name, flags, values) in stats {
        bytes.extend_from_slice(&flags.to_le_bytes());
        bytes.extend_from_slice(&(-9i16).to_le_bytes());
        bytes.extend_from_slice(&(values.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&(offset as u32).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        let mut n = name.as_bytes().to_vec();
        n.resize(NAME_SIZE, 0);
        bytes.extend_from_slice(&n);
        offset += values.len() * 8;
    }
    for (_, _, values) in stats {
        bytes.extend_from_slice(values.as_bytes());
    }
    // SAFETY: a literal name and no flags; the result is checked before it is owned.
    let fd = hvstats_host::os::check(unsafe { libc::memfd_create(c"kvm-stats".as_ptr(), 0) }).unwrap();
    // SAFETY: the kernel just gave us this fd; nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(&bytes).unwrap();
    file
}

fn read(page: &SharedPage, id: CounterId) -> hvstats_abi::histogram::Log2Histogram {
    let copy = page.consistent_snapshot().into_value();
    PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap().histogram(id).unwrap()
}

#[test]
fn kvm_log2_histograms_are_copied_bucket_for_bucket_with_their_sum() {
    let buckets: Vec<u64> = (0..BUCKETS as u64).map(|i| 10 * i + 1).collect();
    let file = stats_file(&[
        ("halt_wait_ns", CUMULATIVE_SECONDS, &[123_456]),
        ("halt_wait_hist", LOG_HIST_SECONDS, &buckets),
        // A sum without its buckets (an older kernel): the histogram is not written at all.
        ("halt_poll_fail_ns", CUMULATIVE_SECONDS, &[999]),
    ]);
    let mut stats = VcpuStats::new(KvmStats::parse(file).unwrap());
    let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
    stats.read();
    let merge = page.begin_merge();
    stats.write(&page, &stats.given());
    drop(merge);
    let h = read(&page, vp::HALT_WAIT_HISTOGRAM);
    assert_eq!(h.sum_ns, 123_456);
    assert_eq!(h.buckets.to_vec(), buckets);
    assert_eq!(read(&page, vp::HALT_POLL_FAIL_HISTOGRAM).count(), 0);
    assert_eq!(read(&page, vp::HALT_POLL_FAIL_HISTOGRAM).sum_ns, 0);
    assert_eq!(read(&page, vp::HALT_POLL_SUCCESS_HISTOGRAM).count(), 0);
    // The merge left the sequence counter even: it closed its window.
    assert_eq!(page.get(vp::SEQUENCE) % 2, 0);
}

#[test]
fn exits_of_known_duration_land_in_their_class_histogram() {
    let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
    let user = UserExitCounts::default();
    let mut acct = ExitAccounting::new(true);
    // Port I/O exits whose handling takes at least 1.2 ms (a handler that spins that long).
    const HANDLER: Duration = Duration::from_micros(1200);
    const N: u64 = 5;
    for _ in 0..N {
        let t0 = cycles::now();
        let start = Instant::now();
        while start.elapsed() < HANDLER {
            std::hint::spin_loop();
        }
        acct.record(&page, &user, UserExit::Io, cycles::now().wrapping_sub(t0));
    }
    // MSR exits that take no time at all.
    for _ in 0..3 {
        acct.record(&page, &user, UserExit::Msr, 0);
    }
    let io = read(&page, vp::IO_TIME_HISTOGRAM);
    assert_eq!(io.count(), N);
    let floor = bucket_of(HANDLER.as_nanos() as u64);
    assert_eq!(floor, 21);
    // The TSC is calibrated to a few percent, so allow one bucket below the handler's: never more.
    assert!(io.buckets[..floor - 1].iter().all(|&b| b == 0), "{io:?}");
    assert!(io.sum_ns >= N * HANDLER.as_nanos() as u64 * 9 / 10, "{io:?}");
    // The cost counter and the histogram measure the same exits with the same clock.
    let cost_ns = page.get(vp::IO_INSTRUCTIONS_COST) * 100;
    assert!(cost_ns.abs_diff(io.sum_ns) <= 100 * (N + 1), "cost {cost_ns} ns, histogram {} ns", io.sum_ns);
    let msr = read(&page, vp::MSR_TIME_HISTOGRAM);
    assert_eq!((msr.count(), msr.buckets[0], msr.sum_ns), (3, 3, 0));
    for other in [vp::HYPERCALLS_TIME_HISTOGRAM, vp::MEMORY_TIME_HISTOGRAM, vp::OTHER_TIME_HISTOGRAM] {
        assert_eq!(read(&page, other).count(), 0);
    }
}
