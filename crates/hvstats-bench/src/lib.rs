//! What hvstats costs, each figure measured side by side with its baseline in the same run: the
//! rows of `hvstats bench`.
//!
//! These machines are noisy, so every row is a ratio of medians over several rounds, ours and the
//! baseline interleaved (alternating which goes first), each timed in the CPU time of the thread
//! doing it (time spent preempted counts for neither side; faults and syscalls count). A [`Row`]
//! is `{"name", "ours", "baseline", "unit", "ratio", "goal", "met"}` in JSON with
//! `ratio = ours / baseline` (lower is better) and `met` whether the ratio is within the goal
//! (`null` for a row without one); the table marks each row `met` or `MISSED` the same way. A row
//! that needs what this host lacks (KVM) is `{"name", "skipped": why}`. Rows are named by what
//! they measured: the snapshot row by the VPs it really read (`partitions` × 16).
//!
//! Rows: the VP thread's page update against an uncontended and a shared `fetch_add`; a
//! kept-mapping read of one VP against a `pread` of a vCPU's KVM stats fd (and, without KVM,
//! against a `pread` of the same page); a consistent copy of a VP page (inside its sequence
//! counter) against a plain one; the full snapshot of 65,536 VPs against a memcpy of the
//! same counter bytes; adding a partition to an instance of 4,096 against one of 64; the
//! exporter's scrape against `snapshot --json`; what observing costs a guest and a counted
//! thread, and counting a tracepoint by method; what observing 64 VMs costs a refresh, and the
//! vCPU kicks QMP costs a guest ([`fleet`]); the userspace exit with accounting on against off;
//! a hypercall against a plain exit.
//!
//! The bench reaches KVM only through `hvstats-kvm`'s public API, and the statistics through
//! `hvstats`' readers, as any other user of the libraries would.

#![deny(missing_docs)]

pub mod authority;
pub mod counting_cost;
mod error;
pub mod exit_cost;
pub mod fleet;
pub mod guest;
pub mod observe;
pub mod overhead;
mod row;
pub mod scrape;

use hvstats::Hypervisor;

pub use error::BenchError;
pub use row::{Row, selects, table_header};
pub use scrape::ScrapeEncoders;

/// What to measure and how much: the options of `hvstats bench`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Rounds per comparison (medians are reported).
    pub rounds: u32,
    /// Userspace exits per guest run (KVM rows).
    pub exits: u32,
    /// Hypercalls per guest run (KVM rows).
    pub hypercalls: u32,
    /// Only the rows whose name contains one of these (none: every row).
    pub only: Vec<String>,
    /// Partitions of 16 VPs of the snapshot row.
    pub partitions: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self { rounds: 7, exits: 20_000, hypercalls: 5_000, only: Vec::new(), partitions: 4096 }
    }
}

/// Whether this host can run the KVM rows, and if not, why.
///
/// # Errors
/// Why /dev/kvm cannot be opened, as the reason a skipped row gives.
pub fn kvm_usable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| format!("needs KVM: /dev/kvm cannot be opened ({e})"))
}

/// Measures the rows `options` selects, in the report's order; the scrape rows with `scrape`'s
/// encoders.
///
/// # Errors
/// When a row's set-up fails (a row this host cannot measure is [`Row::Skipped`] instead).
pub fn run(options: &Options, scrape: &mut dyn ScrapeEncoders) -> Result<Vec<Row>, BenchError> {
    let hv = Hypervisor::new().map_err(|e| BenchError::Step {
        step: "creating the hypervisor instance".into(),
        source: Box::new(e),
    })?;
    let kvm = kvm_usable();
    let wanted = |name: &str| selects(&options.only, name);
    // A group measured together runs when any of its rows is wanted (`--only` a whole row name).
    let any = |names: &[&str]| names.iter().any(|name| wanted(name));
    let rounds = options.rounds;
    let mut rows = Vec::new();
    if any(&authority::UPDATE_ROWS) {
        rows.extend(authority::update_rows(rounds, &hv)?);
    }
    if any(&authority::READ_ROWS) {
        rows.extend(authority::read_rows(rounds, &kvm)?);
    }
    if wanted(authority::CONSISTENCY_ROW) {
        rows.push(authority::consistency_row(rounds)?);
    }
    let snapshot_name = authority::snapshot_row_name(options.partitions);
    if wanted(&snapshot_name) {
        // Rows are named once per run: leaking this one name keeps them all `&'static str`.
        rows.push(authority::snapshot_row(rounds, options.partitions, snapshot_name.leak())?);
    }
    if wanted(authority::PARTITION_ADD_ROW) {
        rows.push(authority::partition_add_row(rounds)?);
    }
    if any(&scrape::ROWS) {
        rows.extend(scrape::scrape_rows(rounds, scrape)?);
    }
    rows.extend(observe::observe_rows(rounds, &kvm, &wanted));
    rows.extend(fleet::fleet_rows(rounds, &kvm, &wanted));
    match &kvm {
        Ok(()) if any(&guest::EXIT_ROWS) => {
            rows.extend(guest::exit_rows(&hv, rounds, options.exits, options.hypercalls)?);
        }
        Ok(()) => {}
        Err(why) => {
            for name in guest::EXIT_ROWS {
                if wanted(name) {
                    rows.push(Row::Skipped { name, why: why.clone() });
                }
            }
        }
    }
    // Only the rows asked for, not the others measured with them.
    rows.retain(|row| wanted(row.name()));
    Ok(rows)
}
