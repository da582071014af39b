//! A temporary runtime directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh runtime directory (mode 0755, as a publisher requires whatever the umask), unique to
/// this test process and call, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty `hvstats-<name>-<pid>-<n>` directory under the system temp dir.
    ///
    /// # Panics
    /// When the directory cannot be created: the test's set-up failed.
    #[allow(clippy::unwrap_used, reason = "test set-up: a failure there is the test failing")]
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
