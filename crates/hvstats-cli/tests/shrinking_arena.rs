//! A live arena its owner truncates while `serve` keeps it mapped: the real `hvstats serve` over
//! an instance this test publishes (its arena is this user's, so `serve` maps it), `truncate`d to
//! 8192 bytes between two scrapes. Before, the next scrape killed `serve` with SIGBUS.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::time::{Duration, Instant};

use common::{Running, TempDir};

/// The value of `hvstats_read_errors` in an exposition.
fn read_errors(metrics: &str) -> u64 {
    common::sample(metrics, "hvstats_read_errors").and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn an_arena_truncated_under_serves_mapping_is_a_read_error_not_a_sigbus() {
    let tmp = TempDir::new("shrinking-arena");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let (hv, part) = common::publish_partition(&runtime, 64);
    part.vp_page(63).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 63);
    let mut serve = Running::start(&["serve", "--listen", "127.0.0.1:0"], &runtime);
    let vp63 =
        |m: &str| m.lines().any(|l| l.starts_with("hvstats_vp_hypercalls_total{") && l.contains("vp=\"63\""));
    let before = serve.metrics_until(Duration::from_secs(20), |m| vp63(m));
    assert_eq!(read_errors(&before), 0, "{before}");
    // The arena's owner truncates it while serve holds it mapped.
    let path = hv.published_path().unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8192).unwrap();
    // The publisher would fault writing past the end it was cut to (as it leaves): it is left as
    // it is.
    std::mem::forget((part, hv));
    // The scrape that meets the new end counts what it could not read; serve lives on.
    let t = Instant::now();
    let mut after = String::new();
    while read_errors(&after) == 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "no read error counted:\n{after}");
        let status = serve.child.try_wait().unwrap();
        assert!(status.is_none(), "serve ended: {status:?}");
        after = serve.get("/metrics");
    }
    assert!(!vp63(&after), "no counter read past the end: {after}");
    // It goes on answering, from what the file holds now, until stopped.
    assert!(serve.get("/healthz").starts_with("ok"), "{}", serve.get("/healthz"));
    assert_eq!(serve.terminate().code(), Some(0));
}
