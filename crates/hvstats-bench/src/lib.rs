//! What hvstats costs, each figure measured side by side with its baseline in the same run: the
//! rows of the `hvstats-bench` tool (`hvstats bench` runs it).
//!
//! These machines are noisy, so a row keeps every round of both sides and says how sure it is
//! ([`row`]): each side's minimum, median and maximum, the ratio of the medians (`ours /
//! baseline`, lower is better), and a 95 % interval for the ratio from rounds paired in ABBA
//! blocks, so that a drift of the host cancels; a row whose interval straddles its goal is
//! undecided, not met or missed. Single-threaded sides are timed in the CPU time of the thread
//! doing them (time spent preempted counts for neither side; faults and syscalls count). A row
//! that needs what this host lacks (KVM) is skipped, with why. Rows are named by what they
//! measured: the snapshot row by the VPs it really read (`partitions` × 16).
//!
//! Rows: the VP thread's page update against an uncontended and a shared `fetch_add`; a
//! kept-mapping read of one VP against a `pread` of a vCPU's KVM stats fd (and, without KVM,
//! against a `pread` of the same page); a consistent copy of a VP page (inside its sequence
//! counter) against a plain one; the full snapshot of 65,536 VPs against a memcpy of the
//! same counter bytes; adding a partition to an instance of 4,096 against one of 64; the
//! exporter's scrape of 65,536 VPs against `snapshot --json`; a fleet host's scrape (1,000 VMs of
//! 4 VPs) against the Prometheus client library encoding the same families alone, and its
//! snapshot API against its scrape; the default scrape of 100 VMs of 4 VPs (its series, bytes
//! and gzipped bytes) against every collector's, and of 1,000 VMs of 4 VPs gzipped against plain;
//! what observing costs a guest and a counted thread, and
//! counting a tracepoint by method; what observing 64 VMs costs a refresh, and the vCPU kicks QMP
//! costs a guest ([`observe_fleet`]); how the observer's CPU, memory and descriptors grow from 64
//! to 1,024 VMs of 4 vCPU threads ([`observe_scale`]); how long a restarted observer takes to
//! adopt 4,096 kept rows ([`restart`]); what the per-thread reads of a refresh cost a vCPU thread
//! ([`thread_reads`]); a full reading of a VMM's descriptors in the kernel against `/proc`
//! ([`vm_fds`]); a host's context switch with the observer running against without
//! ([`context_switch`]); the userspace exit with accounting on against off; a
//! hypercall against a plain exit; how long SIGTERM takes to end `observe --all` and `serve
//! --observe-all` with a VM attached, against the same binary's `serve` alone ([`shutdown`]).
//!
//! The bench reaches KVM only through `hvstats-kvm`'s public API, the statistics through
//! `hvstats`' readers, and the surfaces through `hvstats-present`, as any other user of the
//! libraries would. It is a development tool: nothing the `hvstats` command links depends on it.

#![deny(missing_docs)]

pub mod authority;
pub mod chart;
pub mod client;
pub mod context_switch;
pub mod counting_cost;
pub mod default_scrape;
mod error;
pub mod exit_cost;
pub mod fleet;
pub mod guest;
pub mod observe;
pub mod observe_fleet;
pub mod observe_scale;
pub mod overhead;
pub mod restart;
pub mod row;
pub mod scrape;
pub mod shutdown;
pub mod thread_reads;
pub mod vm_fds;

use hvstats::Hypervisor;

pub use error::BenchError;
pub use row::{Pace, Plan, Progress, Row, Silent, Verdict, selects, table_header};

/// What to measure and how much: the options of `hvstats-bench`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Rounds per comparison (two make an ABBA block); `None`: each group's [`Pace`].
    pub rounds: Option<u32>,
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
        Self { rounds: None, exits: 20_000, hypercalls: 5_000, only: Vec::new(), partitions: 4096 }
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

/// Measures the rows `options` selects, in the report's order, telling `progress` as each group
/// of rows starts and each round ends.
///
/// # Errors
/// When a row's set-up fails (a row this host cannot measure is [`Row::Skipped`] instead).
pub fn run(options: &Options, progress: &dyn Progress) -> Result<Vec<Row>, BenchError> {
    let hv = Hypervisor::new().map_err(|e| BenchError::Step {
        step: "creating the hypervisor instance".into(),
        source: Box::new(e),
    })?;
    let kvm = kvm_usable();
    let wanted = |name: &str| selects(&options.only, name);
    // A group measured together runs when any of its rows is wanted (`--only` a whole row name).
    let any = |names: &[&str]| names.iter().any(|name| wanted(name));
    let plan = Plan::new(options.rounds, progress);
    let mut rows = Vec::new();
    if any(&authority::UPDATE_ROWS) {
        rows.extend(authority::update_rows(&plan, &hv)?);
    }
    if any(&authority::READ_ROWS) {
        rows.extend(authority::read_rows(&plan, &kvm)?);
    }
    if wanted(authority::CONSISTENCY_ROW) {
        rows.push(authority::consistency_row(&plan)?);
    }
    let [snapshot, into_earlier] = authority::snapshot_row_names(options.partitions);
    if wanted(&snapshot) || wanted(&into_earlier) {
        // Rows are named once per run: leaking these names keeps them all `&'static str`.
        rows.extend(authority::snapshot_rows(
            &plan,
            options.partitions,
            snapshot.leak(),
            into_earlier.leak(),
        )?);
    }
    if wanted(authority::PARTITION_ADD_ROW) {
        rows.push(authority::partition_add_row(&plan)?);
    }
    if any(&scrape::ROWS) {
        rows.extend(scrape::scrape_rows(&plan)?);
    }
    if any(&fleet::ROWS) {
        rows.extend(fleet::fleet_rows(&plan, fleet::VMS, fleet::VPS_EACH)?);
    }
    if wanted(default_scrape::ROW) {
        rows.push(default_scrape::default_scrape_row(&plan, default_scrape::VMS, default_scrape::VPS_EACH)?);
    }
    if wanted(default_scrape::FLEET_ROW) {
        rows.push(default_scrape::gzip_row(&plan, default_scrape::FLEET_VMS, default_scrape::VPS_EACH)?);
    }
    rows.extend(observe::observe_rows(&plan, &kvm, &wanted));
    rows.extend(observe_fleet::observe_fleet_rows(&plan, &kvm, &wanted));
    if wanted(thread_reads::ROW) {
        rows.push(thread_reads::thread_reads_row(&plan));
    }
    if wanted(vm_fds::ROW) {
        rows.push(vm_fds::vm_fds_row(&plan));
    }
    rows.extend(observe_scale::observe_scale_rows(&plan, &kvm, &wanted));
    if wanted(context_switch::ROW) {
        rows.push(context_switch::context_switch_row(&plan, &kvm));
    }
    let restart = restart::row_name();
    if wanted(&restart) {
        rows.push(restart::restart_row(&plan, restart.leak()));
    }
    rows.extend(shutdown::shutdown_rows(&plan, &kvm, &wanted));
    match &kvm {
        Ok(()) if any(&guest::EXIT_ROWS) => {
            rows.extend(guest::exit_rows(&hv, &plan, options.exits, options.hypercalls, &wanted)?);
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
