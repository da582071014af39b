//! Set-up shared by the integration tests of the workspace's crates (the others include this file
//! by path): a temporary runtime directory, and the KVM check of tests that need a guest.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh runtime directory (mode 0755, as a publisher requires whatever the umask), unique to
/// this test process and call, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty `hvstats-<name>-<pid>-<n>` directory under the system temp dir.
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("hvstats-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True when /dev/kvm can be used. Without it, the test says "skipped" and passes, unless
/// `HVSTATS_REQUIRE_KVM=1` (set by `.ci/run` on hosts that have /dev/kvm), where it fails.
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
