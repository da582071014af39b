//! The KVM backend of hvstats.

#![deny(missing_docs)]

pub mod hyperv;
