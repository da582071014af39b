//! What the `hvstats` command shows beyond a snapshot, as a library the command calls with its
//! parsed flags:
//!
//! - [`recording`]: the recording format `record` writes and its reader, one VP at a time;
//! - [`report`]: what a recording says per VP, as text or JSON;
//! - [`chart`]: charts of a recording's VP counters over time, as PNG or SVG;
//! - [`top`]: `top`'s table of two readings, which two readings those are, and its live view.
//!
//! Counters a source cannot maintain stay absent here as everywhere: `null` or `-`, never 0.

#![deny(missing_docs)]

pub mod chart;
pub mod recording;
pub mod report;
pub mod top;

/// What `snapshot` and `top` say when no instance publishes under `dir`: that no observer or
/// partition publishes there, and how to start one (the observer's unit publishes under the
/// default directory only; elsewhere the commands name `dir`).
pub fn nothing_publishes(dir: &std::path::Path) -> String {
    let shown = hvstats_present::text::Escaped(&dir.display().to_string()).to_string();
    let (unit, flag) = match dir == std::path::Path::new(hvstats::runtime_dir::DEFAULT_RUNTIME_DIR) {
        true => ("`systemctl start hvstats-observe`, or ", String::new()),
        false => ("", format!(" --runtime-dir {shown}")),
    };
    format!(
        "no observer or partition publishes under {shown}: start the observer ({unit}`hvstats observe \
         --all{flag}` as root) to count the VMs running here, or run a partition (`hvstats run{flag}`)"
    )
}
