//! The hardware counter table against a careless or hostile neighbour: handles that would wrap,
//! links and FIFOs planted in `hwc/`, a directory others can write, a shape configured out of
//! bounds; and refusals that say what is held by whom.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod hwc_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor as D, PhysicalCounterResourceList,
};
use hvstats_hwc::{Allocator, HwcError, Lifetime, PmuShape, Refusal, TableError};
use hwc_support::{TempRuntime, allocator};

/// Runs `f` on a thread and fails the test when it has not returned after 10 s (a hang).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{what} hung"))
}

fn counters(
    a: &Allocator,
    cpus: &[GroupAffinity],
    d: &[D],
) -> Result<hvstats_hwc::CounterSetHandle, HwcError> {
    a.try_allocate(Some(cpus), Some(&PhysicalCounterResourceList::new(d)), Lifetime::Process)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_table_whose_handles_are_used_up_refuses_instead_of_wrapping() {
    let rt = TempRuntime::new("hwc-wrap");
    let a = allocator(&rt);
    let table = a.table_path();
    let last = u64::MAX - 1;
    let text =
        format!(r#"{{"version":1,"next_handle":{last},"generation":{},"pmu":null,"records":[]}}"#, u64::MAX);
    std::fs::write(&table, text).unwrap();
    // The last handle below u64::MAX is granted (and the generation counter wraps harmlessly) ...
    let h = counters(&a, &[GroupAffinity::new(0, 1)], &[D::single(0)]).unwrap();
    assert_eq!(h.raw(), last);
    // ... then nothing more: u64::MAX would be a handle no later table could be above.
    let before = std::fs::read(&table).unwrap();
    match counters(&a, &[GroupAffinity::new(0, 2)], &[D::single(0)]) {
        Err(HwcError::Table(e @ TableError::HandlesExhausted { .. })) => {
            assert!(e.to_string().contains("no handle is left"), "{e}");
        }
        other => panic!("expected exhausted handles, got {other:?}"),
    }
    assert_eq!(std::fs::read(&table).unwrap(), before, "a refused grant changes nothing");
    assert_eq!(a.free(h), NtStatus::SUCCESS);
}

#[test]
fn a_fifo_as_the_table_or_lock_is_refused_not_waited_on() {
    for name in ["table.json", "lock"] {
        let rt = TempRuntime::new("hwc-fifo");
        let a = allocator(&rt);
        mkfifo(&rt.path().join("hwc").join(name));
        let result = bounded("allocations() over a FIFO", move || a.allocations().map(|v| v.len()));
        match result {
            Err(e @ TableError::Unsafe { .. }) => {
                assert!(e.to_string().contains("not a regular file") && e.to_string().contains(name), "{e}")
            }
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn links_planted_in_hwc_are_never_followed() {
    let rt = TempRuntime::new("hwc-links");
    let victim = rt.path().join("victim");
    std::fs::write(&victim, b"root's file").unwrap();
    let a = allocator(&rt);
    let hwc = rt.path().join("hwc");
    // A link as the temporary file: the write replaces the link, the victim is untouched.
    std::os::unix::fs::symlink(&victim, hwc.join("table.json.tmp")).unwrap();
    let h = counters(&a, &[GroupAffinity::new(0, 1)], &[D::single(0)]).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's file");
    assert!(std::fs::symlink_metadata(hwc.join("table.json")).unwrap().file_type().is_file());
    // A link as the table itself is refused by name.
    std::fs::remove_file(hwc.join("table.json")).unwrap();
    std::os::unix::fs::symlink(&victim, hwc.join("table.json")).unwrap();
    match a.allocations() {
        Err(e @ TableError::Unsafe { .. }) => assert!(e.to_string().contains("symbolic link"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(a.free(h), NtStatus::INSUFFICIENT_RESOURCES);
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's file");
}

#[test]
fn the_table_has_owner_only_modes_and_a_group_or_world_writable_hwc_is_refused() {
    let rt = TempRuntime::new("hwc-modes");
    let a = allocator(&rt);
    counters(&a, &[GroupAffinity::new(0, 1)], &[D::single(0)]).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let hwc = rt.path().join("hwc");
    assert_eq!(mode(&hwc), 0o700);
    assert_eq!(mode(&hwc.join("table.json")), 0o600);
    assert_eq!(mode(&hwc.join("lock")), 0o600);
    std::fs::set_permissions(&hwc, std::fs::Permissions::from_mode(0o777)).unwrap();
    for e in [a.allocations().unwrap_err(), Allocator::open(rt.path(), a.pmu().clone()).unwrap_err()] {
        let msg = e.to_string();
        assert!(msg.contains("writable by group or others (mode 777)") && msg.contains("chmod 700"), "{msg}");
    }
    // A link in place of hwc/ is refused too.
    std::fs::remove_dir_all(&hwc).unwrap();
    std::os::unix::fs::symlink("/tmp", &hwc).unwrap();
    let e = Allocator::open(rt.path(), a.pmu().clone()).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[test]
fn a_refusal_names_the_resource_its_holder_and_the_processors() {
    let rt = TempRuntime::new("hwc-why");
    let a = allocator(&rt);
    let h =
        counters(&a, &[GroupAffinity::new(0, 0b11)], &[D::range(0, 2), D::identification_tag(7)]).unwrap();
    match counters(
        &a,
        &[GroupAffinity::new(0, 0b110)],
        &[D::single(2), D::single(4), D::identification_tag(7)],
    ) {
        Err(e @ HwcError::Refused(Refusal::Held { .. })) => {
            assert_eq!(e.status(), NtStatus::INSUFFICIENT_RESOURCES);
            let me = std::process::id();
            let HwcError::Refused(Refusal::Held { handle, holder, .. }) = &e else { unreachable!() };
            assert_eq!((*handle, holder.pid), (h, me));
            assert!(
                e.to_string().ends_with(&format!(
                    "counters 2 tags 7 on CPUs 1 held by handle {h} (process {} pid {me})",
                    holder.name
                )),
                "{e}"
            );
        }
        other => panic!("expected a refusal naming the holder, got {other:?}"),
    }
    // Exclusive use conflicts with everything the other holds.
    let e = a.try_allocate(Some(&[GroupAffinity::new(0, 1)]), None, Lifetime::Process).unwrap_err();
    assert!(e.to_string().contains("counters 0-2 tags 7 on CPUs 0 held by handle"), "{e}");
}

#[test]
fn without_a_pmu_a_refusal_says_so() {
    let rt = TempRuntime::new("hwc-nopmu-why");
    let a = Allocator::open(rt.path(), PmuShape::absent(4, "no hardware PMU in this test").unwrap()).unwrap();
    match counters(&a, &[GroupAffinity::new(0, 1)], &[D::single(0)]) {
        Err(e @ HwcError::Refused(Refusal::NoPmu { .. })) => {
            assert_eq!(
                e.to_string(),
                "STATUS_INSUFFICIENT_RESOURCES (0xC000009A): no PMU: no hardware PMU in this test"
            );
        }
        other => panic!("expected a no-PMU refusal, got {other:?}"),
    }
}
