//! The KVM check of tests that need a guest.

/// True when /dev/kvm can be used. Without it, the test says "skipped" and passes, unless
/// `HVSTATS_REQUIRE_KVM=1` (set by `.ci/run` on hosts that have /dev/kvm), where it fails.
///
/// # Panics
/// Without /dev/kvm under `HVSTATS_REQUIRE_KVM=1`.
pub fn kvm_available(test: &str) -> bool {
    if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok() {
        return true;
    }
    let msg = format!("{test}: /dev/kvm is not available; this test needs KVM");
    assert!(
        std::env::var("HVSTATS_REQUIRE_KVM").as_deref() != Ok("1"),
        "{msg} (failing because HVSTATS_REQUIRE_KVM=1)"
    );
    eprintln!("{msg}: skipped");
    false
}

/// The KVM vCPU descriptors process `pid` holds (`anon_inode:kvm-vcpu:N`; not their statistics
/// descriptors); 0 when its descriptors cannot be listed.
pub fn kvm_vcpus(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| {
        dir.flatten()
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("anon_inode:kvm-vcpu:"))
            })
            .count()
    })
}

/// Waits until process `pid` holds `n` KVM vCPUs (a VMM makes them after it starts).
///
/// # Panics
/// When it does not within `limit`.
pub fn wait_for_kvm_vcpus(pid: i32, n: usize, limit: std::time::Duration) {
    let start = std::time::Instant::now();
    while kvm_vcpus(pid) < n {
        assert!(start.elapsed() < limit, "process {pid} made no {n} KVM vCPUs in {limit:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Starts `command` (a QEMU); `None`, printing why, when it cannot be started and the test is
/// not run by CI (which installs QEMU).
///
/// # Panics
/// When it cannot be started under CI.
pub fn spawn_qemu(command: &mut std::process::Command, test: &str) -> Option<std::process::Child> {
    match command.spawn() {
        Ok(child) => Some(child),
        Err(e) => {
            assert!(
                std::env::var("CI").is_err(),
                "qemu-system-x86_64 cannot be started ({e}); .ci/run installs it"
            );
            eprintln!("{test}: qemu-system-x86_64 cannot be started ({e}): skipped");
            None
        }
    }
}
