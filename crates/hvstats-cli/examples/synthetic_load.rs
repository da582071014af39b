//! Publishes an instance whose VPs count steady, made-up traffic (see
//! [`hvstats_testkit::synthetic_load`]), so the operator surfaces (`top`, `serve`, `record`,
//! `plot`) and the dashboard can be tried and shown on a host without KVM.
//!
//! ```sh
//! cargo run --example synthetic_load -- /tmp/hv 30   # runtime dir, seconds
//! ```

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: synthetic_load RUNTIME_DIR [SECONDS]")?);
    let seconds: f64 = args.next().map_or(Ok(30.0), |s| s.parse())?;
    std::fs::create_dir_all(&dir)?;
    hvstats_testkit::synthetic_load(&dir, seconds, &AtomicBool::new(false))?;
    Ok(())
}
