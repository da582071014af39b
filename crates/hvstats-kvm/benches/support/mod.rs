//! The exit round trip the benches compare against: a guest workload of port writes, which the
//! backend itself cannot build (the guest programs depend on the ABI, not the other way round).

use std::sync::Arc;
use std::time::Duration;

use hvstats::Hypervisor;
use hvstats_guest::program::LoopCount;
use hvstats_guest::{Mode, Workload, layout};
use hvstats_kvm::{Handlers, Partition, PartitionConfig};

/// Runs a one-VP long-mode guest doing `exits` OUTs to the sink port (each one a userspace exit)
/// and returns the VP's run time divided by the exits (the exit port write included).
pub fn round_trip(hv: &Arc<Hypervisor>, exits: u32, accounting: bool) -> Duration {
    let workload = Workload { out: LoopCount::fixed(exits), ..Workload::default() };
    let image = workload.build(Mode::Long, layout::DEFAULT_LOAD_GPA).expect("bench guest");
    let config =
        PartitionConfig { accounting, timeout: Duration::from_secs(120), ..PartitionConfig::default() };
    let partition = Partition::new(hv, config, Handlers::builtin()).expect("partition");
    partition.load(image.load_gpa, &image.bytes).expect("load");
    let report = partition.run(image.entry).expect("run");
    let vp = &report.vps[0];
    assert!(vp.fault.is_none(), "bench guest faulted: {:?}", vp.fault);
    vp.run_time / (exits + 1)
}
