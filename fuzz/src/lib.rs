//! Fuzz targets for hvstats. Each target's body is a plain function here, so the workspace tests
//! run the very same checks on random inputs without nightly or libFuzzer.

pub mod bytes;
pub mod hal_request;
pub mod hypercall_dispatch;
pub mod index;
pub mod page_reader;
pub mod random;
pub mod runtime_tree;
