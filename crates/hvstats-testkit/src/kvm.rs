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
