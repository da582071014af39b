//! The body of the `hal_request` fuzz target (`fuzz/src/hal_request.rs`), run on reproducible
//! random inputs with stable Rust: HAL resource-list requests and frees against one allocation
//! table. The same function is what libFuzzer drives (`fuzz/README.md`); here it runs a bounded
//! number of inputs, and a run that never reaches a grant fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

#[allow(dead_code, reason = "the other fuzz bodies read the fields this one does not")]
#[path = "../../../fuzz/src/bytes.rs"]
mod bytes;
#[path = "../../../fuzz/src/hal_request.rs"]
mod hal_request;
mod hwc_support;
#[path = "../../../fuzz/src/random.rs"]
mod random;

use hwc_support::TempRuntime;
use random::Rng;

#[test]
fn hal_requests_keep_their_contract_on_random_arguments() {
    let dir = TempRuntime::new("fuzz-body-hal");
    let mut rng = Rng(0x4861_6c41_6c6c_6f63);
    let mut grants = 0;
    for _ in 0..400 {
        grants += hal_request::check(&rng.bytes(300), dir.path());
    }
    assert!(grants > 100, "the generator rarely makes a grantable request ({grants})");
}
