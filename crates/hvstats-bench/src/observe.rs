//! Rows of what observing costs: the observed guest's time per exit with and without the
//! observer, a counted thread's time per event with and without counters, and what counting a
//! tracepoint costs by method ([`crate::overhead`], [`crate::counting_cost`]).

use std::time::Duration;

use crate::counting_cost as cost;
use crate::overhead::{self, ExitRates};
use crate::row::{Plan, Rounds, Row};

/// Each round's rate (per second) as ns per event.
fn ns_per_event(rates: &[f64]) -> Vec<f64> {
    rates.iter().map(|r| 1e9 / r).collect()
}

/// What `hvstats observe` costs: the observed guest's time per exit with the observer over
/// without it (a QEMU with KVM; goal ≤ 1.01, i.e. an exit rate ≥ 0.99 of the unobserved one),
/// and, runnable anywhere, a thread's time per counted `getppid` with the observer's counters on
/// it over without (an enabled syscall tracepoint also sends every system call through the slow
/// path, so this overstates the cost). Only the rows `wanted` selects are measured; `kvm` says
/// whether this host can run a guest, and if not why.
pub fn observe_rows(plan: &Plan<'_>, kvm: &Result<(), String>, wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    let mut rows = Vec::new();
    let guest_rows = [overhead::GUEST_ROW, overhead::GUEST_OVER_ATTACHED_ROW, overhead::ATTACHED_ROW];
    if guest_rows.iter().any(|r| wanted(r)) {
        let measured = match kvm {
            Ok(()) => {
                overhead::guest_exit_rate_on_vs_off(plan, Duration::from_secs(2), Duration::from_secs(1))
                    .map_err(|e| hvstats_host::error_chain::error_chain(&e))
            }
            Err(why) => Err(why.clone()),
        };
        for name in guest_rows.into_iter().filter(|r| wanted(r)) {
            rows.push(match &measured {
                Ok(rates) => {
                    let (on, off, attached) = (
                        ns_per_event(&rates.observed),
                        ns_per_event(&rates.unobserved),
                        ns_per_event(&rates.attached),
                    );
                    let (ours, baseline, goal) = match name {
                        overhead::GUEST_ROW => (on, off, Some(1.01)),
                        overhead::GUEST_OVER_ATTACHED_ROW => (on, attached, Some(1.01)),
                        _ => (attached, off, None),
                    };
                    Row::measured(name, Rounds { ours, baseline }, "ns/exit", goal)
                }
                Err(why) => Row::Skipped { name, why: why.clone() },
            });
        }
    }
    rows.extend(counting_cost_rows(plan, wanted));
    if wanted(overhead::COUNTING_ROW) {
        rows.push(match overhead::counted_event_rate_on_vs_off(plan, 200_000) {
            Ok(ExitRates { observed, unobserved, .. }) => Row::measured(
                overhead::COUNTING_ROW,
                Rounds { ours: ns_per_event(&observed), baseline: ns_per_event(&unobserved) },
                "ns/event",
                None,
            ),
            Err(why) => Row::Skipped { name: overhead::COUNTING_ROW, why },
        });
    }
    rows
}

/// What counting a tracepoint costs the firing thread: 1, 4 and 16 filtered perf events
/// against one in-kernel program counting as many classes, and the VMX load (every intercept
/// class of `kvm_exit` against one) on a tracepoint that fires on every host. ns per call.
fn counting_cost_rows(plan: &Plan<'_>, wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    let to_rows = |names: &[&'static str], measured: Result<Vec<cost::CostRow>, String>| -> Vec<Row> {
        match measured {
            Ok(rows) => rows
                .into_iter()
                .filter(|r| wanted(r.name))
                .map(|r| Row::measured(r.name, r.rounds, "ns/event", r.goal))
                .collect(),
            Err(why) => names
                .iter()
                .filter(|n| wanted(n))
                .map(|name| Row::Skipped { name, why: why.clone() })
                .collect(),
        }
    };
    let mut rows = Vec::new();
    let mut names: Vec<&'static str> = cost::PERF_VS_PROGRAM_ROWS.iter().map(|(_, n)| *n).collect();
    names.extend([cost::PROGRAM_16_VS_NONE, cost::PERF_16_VS_NONE]);
    if names.iter().any(|n| wanted(n)) {
        rows.extend(to_rows(&names, cost::tracepoint_costs(plan, 200_000)));
    }
    let names = [cost::VMX_PROXY_ROW, cost::VMX_PROXY_PERF_ROW];
    if names.iter().any(|n| wanted(n)) {
        rows.extend(to_rows(&names, cost::vmx_proxy(plan, 200_000)));
    }
    rows
}
