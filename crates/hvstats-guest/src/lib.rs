//! Guest programs for hvstats partitions.

#![deny(missing_docs)]

pub mod hyperv;
