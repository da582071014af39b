//! Rows of the statistics authority, runnable on any host: the VP thread's page update, reads
//! of a VP page (kept mapping, consistent copy, `pread`, a vCPU's KVM stats fd), the full
//! snapshot of a large host, and adding a partition to a large instance.

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hvstats::attach::Attach;
use hvstats::index::Entry;
use hvstats::reader::ArenaReader;
use hvstats::rules::StatsObject;
use hvstats::{Hypervisor, InstanceConfig, PartitionStats, SharedPage};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::vp;
use hvstats_abi::page::{PAGE_SLOTS, PageLayout};

use crate::error::{BenchError, Present, Step};
use crate::row::{CpuClock, Plan, Row, median, ns_per, side_by_side};

/// Names of the rows of [`update_rows`].
pub const UPDATE_ROWS: [&str; 2] = ["update-vs-fetch-add", "update-vs-shared-fetch-add"];
/// Names of the rows of [`read_rows`].
pub const READ_ROWS: [&str; 2] = ["read-vp-vs-stats-fd", "read-vp-vs-pread-page"];
/// The name of [`consistency_row`].
pub const CONSISTENCY_ROW: &str = "vp-read-consistent-vs-plain";
/// The name of [`partition_add_row`].
pub const PARTITION_ADD_ROW: &str = "partition-add-4096-vs-64";

/// The names of the snapshot rows for `partitions` partitions of 16 VPs (what they really read):
/// the snapshot into fresh memory, and into an earlier snapshot's.
pub fn snapshot_row_names(partitions: u32) -> [String; 2] {
    let vps = u64::from(partitions) * 16;
    [format!("snapshot-{vps}-vps-vs-memcpy"), format!("snapshot-{vps}-vps-into-earlier-vs-memcpy")]
}

const OPS: u64 = 2_000_000;

/// The VP thread's update of its own page as its exit path does it: a plain load and store at
/// a slot known at compile time.
fn page_updates(page: &SharedPage) -> f64 {
    let start = CpuClock::now();
    for _ in 0..OPS {
        page.add(vp::CPUID_INSTRUCTIONS, black_box(1));
    }
    ns_per(start, OPS)
}

fn fetch_adds(counter: &AtomicU64) -> f64 {
    let start = CpuClock::now();
    for _ in 0..OPS {
        black_box(counter).fetch_add(black_box(1), Ordering::Relaxed);
    }
    ns_per(start, OPS)
}

/// `threads` threads at once, each running `f(thread)`; the median of their ns/op.
fn in_threads(threads: usize, f: &(dyn Fn(usize) -> f64 + Sync)) -> f64 {
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    f(t)
                })
            })
            .collect();
        median(handles.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).collect())
    })
}

/// The VP thread's page update against an uncontended `fetch_add`, and in as many threads as
/// there are CPUs (2 to 8), each on its own VP page, against all of them on one shared counter.
///
/// # Errors
/// When the bench partition cannot be created.
pub fn update_rows(plan: &Plan<'_>, hv: &Arc<Hypervisor>) -> Result<Vec<Row>, BenchError> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
    let part = hv.create_partition(threads as u32).step("creating the bench partition")?;
    let page0 = part.vp_page(0).present("VP 0")?;
    let own = AtomicU64::new(0);
    let rounds = side_by_side(plan, UPDATE_ROWS[0], || page_updates(page0), || fetch_adds(&own));
    let mut rows = vec![Row::measured(UPDATE_ROWS[0], rounds, "ns/update", Some(0.33))];
    let shared = AtomicU64::new(0);
    let part_ref: &PartitionStats = &part;
    let vp_pages = |t: usize| part_ref.vp_page(t as u32).map_or(f64::NAN, page_updates);
    let rounds = side_by_side(
        plan,
        UPDATE_ROWS[1],
        || in_threads(threads, &vp_pages),
        || in_threads(threads, &|_| fetch_adds(&shared)),
    );
    rows.push(Row::measured(UPDATE_ROWS[1], rounds, "ns/update", Some(0.1)));
    hv.remove_partition(part.id());
    Ok(rows)
}

/// A temporary runtime directory for the instances the bench publishes, removed on drop.
pub(crate) struct TempRuntime(PathBuf);

impl TempRuntime {
    /// A new, empty directory for the rows of `what`.
    pub(crate) fn new(what: &str) -> Result<Self, BenchError> {
        // tmpfs, as the runtime directory (/run) is, when there is one: a disk-backed file would
        // add writeback of the pages to what is measured.
        let base = match Path::new("/dev/shm") {
            shm if shm.is_dir() => shm.to_owned(),
            _ => std::env::temp_dir(),
        };
        let dir = base.join(format!("hvstats-bench-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).step(format!("creating {}", dir.display()))?;
        // Whatever the umask: a runtime directory others may write is refused.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .step(format!("setting the mode of {}", dir.display()))?;
        Ok(Self(dir))
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempRuntime {
    /// Removes the directory, and the in-kernel counts an observer of it kept in bpffs: a row's
    /// observer ends while its VMs run, which keeps them (programs attached) for a next one.
    fn drop(&mut self) {
        hvstats_host::bpf::keep::remove_tree(&hvstats_host::bpf::keep::identity_path(&self.0));
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn published(dir: &Path) -> Result<Arc<Hypervisor>, BenchError> {
    Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(dir.to_owned()),
        logical_processors: Some(vec![0]),
        ..Default::default()
    })
    .step("publishing a bench instance")
}

/// A reader's buffer for one page, page-aligned as the page it copies: the same place in a page
/// for every side of a row, so that no side's copy pays for a store whose address happens to
/// alias a later load in the processor's store buffer (4 KiB aliasing) and the other's not.
#[repr(C, align(4096))]
struct PageBuffer([u64; PAGE_SLOTS]);

impl PageBuffer {
    fn new() -> Box<Self> {
        Box::new(Self([0; PAGE_SLOTS]))
    }
}

/// Words of a VP page this build's layout uses (headers and counters).
fn vp_words() -> usize {
    PageLayout::of(ObjectKind::Vp).end_offset / 8 + 1
}

/// A read of one VP through a kept mapping of a published instance against a `pread` of a
/// vCPU's KVM stats fd (`kvm` says whether this host can open one, and if not why), and against
/// a `pread` of the same page from the arena file.
///
/// # Errors
/// When the bench instance cannot be published or attached, or the vCPU cannot be opened.
pub fn read_rows(plan: &Plan<'_>, kvm: &Result<(), String>) -> Result<Vec<Row>, BenchError> {
    let rt = TempRuntime::new("read")?;
    let hv = published(&rt.0)?;
    let part = hv.create_partition(1).step("creating the bench partition")?;
    part.vp_page(0).present("VP 0")?.set(vp::HYPERCALLS, 1);
    let mut attach = Attach::new(&rt.0);
    attach.refresh().step("attaching the bench instance")?;
    let instance = attach.instances().next().present("the bench instance is not found")?;
    let object = StatsObject::Vp(part.id(), 0);
    let mut words = PageBuffer::new();
    let words = &mut words.0[..vp_words()];
    let n = 200_000u64;
    let mut kept = || {
        let start = CpuClock::now();
        for _ in 0..n {
            let _ = instance.read_prefix(black_box(object), words);
        }
        black_box(&*words);
        ns_per(start, n)
    };
    let mut rows = Vec::new();
    match kvm {
        Ok(()) => {
            let vcpu = hvstats_testkit::IdleVcpu::new().step("opening a vCPU's KVM stats fd")?;
            let stats = &vcpu.stats;
            let mut buf = vec![0u64; stats.data_words()];
            let rounds = side_by_side(plan, READ_ROWS[0], &mut kept, || {
                let start = CpuClock::now();
                for _ in 0..n / 10 {
                    let _ = stats.read_into(&mut buf);
                }
                ns_per(start, n / 10)
            });
            rows.push(Row::measured(READ_ROWS[0], rounds, "ns/read", Some(0.15)));
        }
        Err(why) => rows.push(Row::Skipped { name: READ_ROWS[0], why: why.clone() }),
    }
    // Without KVM, the nearest baseline: one pread of the same page from the arena file.
    let path = hv.published_path().present("the bench instance has no published path")?;
    let file = std::fs::File::open(&path).step(format!("opening {}", path.display()))?;
    let offset = part.vp_page(0).present("VP 0")?.file_offset();
    let mut page = vec![0u8; vp_words() * 8];
    let rounds = side_by_side(plan, READ_ROWS[1], &mut kept, || {
        let start = CpuClock::now();
        for _ in 0..n / 10 {
            let _ = file.read_at(&mut page, offset);
        }
        ns_per(start, n / 10)
    });
    rows.push(Row::measured(READ_ROWS[1], rounds, "ns/read", None));
    Ok(rows)
}

/// What consistency costs a reader: copying a VP page from the arena inside its sequence counter
/// (two more loads and a compare, retried while a merge is under way) over the plain copy checked
/// only against the slot's entry, both of the words the layout uses, side by side.
///
/// # Errors
/// When the bench instance cannot be published or its arena read.
pub fn consistency_row(plan: &Plan<'_>) -> Result<Row, BenchError> {
    let rt = TempRuntime::new("consistent")?;
    let hv = published(&rt.0)?;
    let part = hv.create_partition(1).step("creating the bench partition")?;
    part.vp_page(0).present("VP 0")?.set(vp::HYPERCALLS, 1);
    let path = hv.published_path().present("the bench instance has no published path")?;
    let file = std::fs::File::open(&path).step(format!("opening {}", path.display()))?;
    let arena = ArenaReader::open(file).step("opening the bench arena")?;
    if !arena.is_mapped() {
        return Err(BenchError::Missing("the bench arena is ours, so mapped, but it is not".into()));
    }
    let (slot, generation) = (0..arena.slots())
        .find_map(|slot| {
            let entry = Entry::decode(&arena.entry_words(slot).ok()?).ok()??;
            (entry.kind == ObjectKind::Vp).then_some((slot, entry.generation))
        })
        .present("the bench VP is not in the arena")?;
    let (mut consistent, mut plain) = (PageBuffer::new(), PageBuffer::new());
    let (consistent, plain) = (&mut consistent.0[..vp_words()], &mut plain.0[..vp_words()]);
    let n = 500_000u64;
    let sequence = vp::SEQUENCE.slot();
    let rounds = side_by_side(
        plan,
        CONSISTENCY_ROW,
        || {
            let start = CpuClock::now();
            for _ in 0..n {
                let _ = arena.read_page_prefix_consistent(black_box(slot), generation, consistent, sequence);
            }
            black_box(&*consistent);
            ns_per(start, n)
        },
        || {
            let start = CpuClock::now();
            for _ in 0..n {
                let _ = arena.read_page_prefix(black_box(slot), generation, plain);
            }
            black_box(&*plain);
            ns_per(start, n)
        },
    );
    Ok(Row::measured(CONSISTENCY_ROW, rounds, "ns/read", Some(1.1)))
}

/// The full snapshot of `partitions` × 16 VPs of a published instance against a memcpy of the
/// same counter bytes from the same pages into a buffer that stays (faulted in once): row `name`
/// takes each snapshot into fresh memory ([`Instance::snapshot`], every page copied, checked and
/// decoded), row `into_earlier` (no goal) into the previous round's snapshot
/// ([`Instance::snapshot_into`], what a reader that keeps reading can do). With
/// `HVSTATS_BENCH_TRACE` set, each fresh snapshot's time and the time to drop it are written to
/// stderr.
///
/// [`Instance::snapshot_into`]: hvstats::attach::Instance::snapshot_into
/// [`Instance::snapshot`]: hvstats::attach::Instance::snapshot
///
/// # Errors
/// When the bench instance cannot be published or attached.
pub fn snapshot_rows(
    plan: &Plan<'_>,
    partitions: u32,
    name: &'static str,
    into_earlier: &'static str,
) -> Result<Vec<Row>, BenchError> {
    let rt = TempRuntime::new("snapshot")?;
    let hv = published(&rt.0)?;
    let parts = (0..partitions)
        .map(|_| hv.create_partition(16))
        .collect::<Result<Vec<_>, _>>()
        .step("publishing the bench partitions")?;
    for (i, p) in parts.iter().enumerate() {
        for n in 0..16 {
            if let Some(page) = p.vp_page(n) {
                page.set(vp::HYPERCALLS, i as u64);
            }
        }
    }
    let mut attach = Attach::new(&rt.0);
    attach.refresh().step("attaching the bench instance")?;
    let instance = attach.instances_mut().next().present("the bench instance is not found")?;
    let words = vp_words();
    let sources: Vec<*const u8> = parts
        .iter()
        .flat_map(|p| (0..16).filter_map(|n| p.vp_page(n).map(|pg| pg.host_address() as *const u8)))
        .collect();
    let mut copy = vec![0u8; sources.len() * words * 8];
    let mut memcpy = || {
        let start = CpuClock::now();
        for (i, src) in sources.iter().enumerate() {
            // SAFETY: each source is a live VP page of PAGE_SIZE bytes (the partitions are held
            // above) and `copy` has room for `words` words per page.
            unsafe {
                std::ptr::copy_nonoverlapping(*src, copy.as_mut_ptr().add(i * words * 8), words * 8);
            }
        }
        black_box(&copy);
        ms(start)
    };
    let trace = std::env::var_os("HVSTATS_BENCH_TRACE").is_some();
    let fresh = side_by_side(
        plan,
        name,
        || {
            let start = CpuClock::now();
            let snapshot = black_box(instance.snapshot());
            let took = ms(start);
            let start = CpuClock::now();
            drop(snapshot);
            if trace {
                eprintln!("hvstats-bench: snapshot {took:.1} ms, dropping it {:.1} ms", ms(start));
            }
            took
        },
        &mut memcpy,
    );
    // Measured after the fresh ones, so that no earlier snapshot's memory was there for the
    // allocator to hand out again to those.
    let mut reused = instance.snapshot();
    let into = side_by_side(
        plan,
        into_earlier,
        || {
            let start = CpuClock::now();
            instance.snapshot_into(black_box(&mut reused));
            ms(start)
        },
        &mut memcpy,
    );
    Ok(vec![
        Row::measured(name, fresh, "ms/snapshot", Some(5.0)),
        Row::measured(into_earlier, into, "ms/snapshot", None),
    ])
}

/// Milliseconds of this thread's CPU time since `start`.
fn ms(start: CpuClock) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// Adding (and removing) a partition of 16 VPs to an instance of 4,096 partitions against one
/// of 64.
///
/// # Errors
/// When the bench instances cannot be published or filled.
pub fn partition_add_row(plan: &Plan<'_>) -> Result<Row, BenchError> {
    let (small_rt, large_rt) = (TempRuntime::new("add-64")?, TempRuntime::new("add-4096")?);
    let (small, large) = (published(&small_rt.0)?, published(&large_rt.0)?);
    let _keep_small: Vec<_> = (0..64)
        .map(|_| small.create_partition(16))
        .collect::<Result<_, _>>()
        .step("filling the small instance")?;
    let _keep_large: Vec<_> = (0..4096)
        .map(|_| large.create_partition(16))
        .collect::<Result<_, _>>()
        .step("filling the large instance")?;
    let adds = 200u32;
    let time_adds = |hv: &Arc<Hypervisor>| {
        let mut total = Duration::ZERO;
        for _ in 0..adds {
            let start = CpuClock::now();
            let p = hv.create_partition(16);
            total += start.elapsed();
            if let Ok(p) = p {
                hv.remove_partition(p.id());
            }
        }
        total.as_nanos() as f64 / f64::from(adds) / 1e3
    };
    let rounds = side_by_side(plan, PARTITION_ADD_ROW, || time_adds(&large), || time_adds(&small));
    Ok(Row::measured(PARTITION_ADD_ROW, rounds, "us/add", Some(2.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_rows_are_named_by_the_vps_they_read() {
        assert_eq!(
            snapshot_row_names(4096),
            ["snapshot-65536-vps-vs-memcpy", "snapshot-65536-vps-into-earlier-vs-memcpy"]
        );
        assert_eq!(snapshot_row_names(64)[0], "snapshot-1024-vps-vs-memcpy");
        assert_eq!(snapshot_row_names(65_536)[1], "snapshot-1048576-vps-into-earlier-vs-memcpy");
    }
}
