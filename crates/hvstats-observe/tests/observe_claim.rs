//! Claims on VMMs (one observer per VM per host): held while the claimant lives, free again
//! once it is gone, under the runtime directory's trust checks.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::os::unix::fs::PermissionsExt;

use hvstats_observe::claim::{CLAIMS_DIR, Claim, ClaimError};
use observe_support::TempDir;

#[test]
fn a_claim_is_held_once_and_free_again_when_released() {
    let tmp = TempDir::new("claim");
    let pid = std::process::id() as i32;
    let claim = Claim::take(tmp.path(), pid, "1-2-0").unwrap();
    let file = tmp.path().join(CLAIMS_DIR).join(claim.name());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{pid} 1-2-0\n"));
    // flock is per open file: a second take, even from this process, is refused.
    match Claim::take(tmp.path(), pid, "3-4-0") {
        Err(ClaimError::Taken { holder, instance }) => {
            assert_eq!(holder, std::process::id());
            assert_eq!(instance.as_deref(), Some("1-2-0"));
        }
        other => panic!("{other:?}"),
    }
    drop(claim);
    assert!(!file.exists(), "a released claim leaves no file");
    let again = Claim::take(tmp.path(), pid, "3-4-0").unwrap();
    // A claim file left by a holder that died (no lock on it) is taken over.
    let stale = tmp.path().join(CLAIMS_DIR).join(again.name());
    drop(again);
    std::fs::write(&stale, "999999 dead-0-0\n").unwrap();
    std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).unwrap();
    let taken = Claim::take(tmp.path(), pid, "5-6-0").unwrap();
    assert_eq!(std::fs::read_to_string(&stale).unwrap(), format!("{pid} 5-6-0\n"));
    drop(taken);
}

#[test]
fn claims_are_refused_in_an_untrusted_directory_or_through_a_planted_link() {
    let tmp = TempDir::new("claim-trust");
    let pid = std::process::id() as i32;
    let claims = tmp.path().join(CLAIMS_DIR);
    std::fs::create_dir(&claims).unwrap();
    std::fs::set_permissions(&claims, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Claim::take(tmp.path(), pid, "x").unwrap_err();
    assert!(format!("{:?}", e).contains("Writable"), "{e:?}");
    std::fs::set_permissions(&claims, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A link planted at the claim's name is not followed (nor written through).
    let name = Claim::take(tmp.path(), pid, "x").unwrap().name().to_owned();
    let target = tmp.path().join("target");
    std::fs::write(&target, "keep").unwrap();
    std::os::unix::fs::symlink(&target, claims.join(&name)).unwrap();
    let e = Claim::take(tmp.path(), pid, "x").unwrap_err();
    assert!(format!("{e:?}").contains("NotRegular"), "{e:?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    // A process that does not exist cannot be claimed.
    assert!(matches!(Claim::take(tmp.path(), i32::MAX, "x"), Err(ClaimError::StartTime { .. })));
}

/// True when this process runs as root (it may then act as `nobody` too).
fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_claim_held_by_another_user_does_not_count_and_claim_files_are_the_owners_alone() {
    use std::os::unix::process::CommandExt;
    if !root() {
        eprintln!("skipped: needs root to lock a claim as nobody");
        return;
    }
    let tmp = TempDir::new("claim-nobody");
    let pid = std::process::id() as i32;
    let claim = Claim::take(tmp.path(), pid, "1-2-0").unwrap();
    let file = tmp.path().join(CLAIMS_DIR).join(claim.name());
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a claim file anyone may open (and so flock)");
    drop(claim);
    // A stale claim readable by all (as an older hvstats left them), locked by nobody.
    std::fs::write(&file, "999999 stale-0-0\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut holder = std::process::Command::new("flock")
        .args(["--exclusive", "--nonblock"])
        .arg(&file)
        .args(["sleep", "60"])
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let locked = std::fs::File::open(&file).unwrap();
    while !hvstats::trust::holders(&locked).unwrap().iter().any(|h| h.euid == Some(65534)) {
        assert!(std::time::Instant::now() < deadline, "nobody never locked the claim");
        assert!(holder.try_wait().unwrap().is_none(), "flock as nobody failed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let taken = Claim::take(tmp.path(), pid, "5-6-0");
    let _ = holder.kill();
    let _ = holder.wait();
    let taken = taken.expect("a lock held by nobody counted as a claim");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{pid} 5-6-0\n"));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    drop(taken);
    // A stale readable claim nobody holds is taken over and made the owner's alone.
    std::fs::write(&file, "999999 stale-0-0\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let taken = Claim::take(tmp.path(), pid, "7-8-0").unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    drop(taken);
}
