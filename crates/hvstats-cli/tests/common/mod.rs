//! Set-up shared by the command's integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A directory under the system temp dir, unique to this test process, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh, empty `hvstats-cli-<name>-<pid>` directory.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hvstats-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
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

/// True when /dev/kvm can be used. Without it, the test says so and passes, except under CI where
/// it fails.
pub fn kvm_available(test: &str) -> bool {
    if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok() {
        return true;
    }
    let msg = format!("{test}: /dev/kvm is not available; this test needs KVM");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg} (failing because CI=true)");
    eprintln!("{msg}: skipped");
    false
}
