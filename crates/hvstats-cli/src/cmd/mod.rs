//! One module per subcommand: its flags and what it does.

pub mod bench;
pub mod catalog;
pub mod dump;
pub mod hwc;
pub mod observe;
pub mod run;
pub mod snapshot;
