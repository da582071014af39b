//! One module per subcommand: its flags and what it does.

pub mod bench;
pub mod catalog;
pub mod dump;
pub mod hwc;
pub mod live;
pub mod observe;
pub mod plot;
pub mod record;
pub mod recording;
pub mod report;
pub mod run;
pub mod serve;
pub mod snapshot;
pub mod top;
