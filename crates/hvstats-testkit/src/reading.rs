//! A reading of a large host built in memory: what the surfaces' tests render and the scrape
//! bench encodes, without mapping a page.

use hvstats::snapshot::{InstanceSnapshot, ObjectReading, PartitionSnapshot, VpSnapshot};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{counters_of, vp};

/// An instance `4242-1-0` (pid 4242) with `partitions` partitions (ids from 1) of `vps_each` VPs,
/// every counter of every object set, to distinct values: counter `i` of the object numbered `n`
/// (the hypervisor 0, partition `p` by `p`, VP `i` of partition `p` by `p × vps_each + i`)
/// reads `n × 1000 + i`, except the VPs' publication time, 0 (never published), so a reader
/// dates two such readings by its own clock.
pub fn synthetic_instance(partitions: u32, vps_each: u32) -> InstanceSnapshot {
    let counters = |seed: u64, kind| {
        ObjectReading::Counters(
            counters_of(kind)
                .enumerate()
                .map(|(i, c)| (c, if c.id == vp::PUBLISHED { 0 } else { seed * 1000 + i as u64 }))
                .collect(),
        )
    };
    let partitions = (0..partitions)
        .map(|p| PartitionSnapshot {
            id: u64::from(p) + 1,
            active: true,
            name: String::new(),
            vmm: None,
            uuid: None,
            hyperv_enlightenments: 0,
            stopped: None,
            reading: counters(u64::from(p), ObjectKind::Partition),
            vps: (0..vps_each)
                .map(|index| VpSnapshot {
                    index,
                    reading: counters(u64::from(p * vps_each + index), ObjectKind::Vp),
                    histograms: Vec::new(),
                })
                .collect(),
        })
        .collect();
    InstanceSnapshot {
        name: "4242-1-0".into(),
        pid: 4242,
        description: Default::default(),
        hypervisor: counters(0, ObjectKind::Hypervisor),
        lps: Vec::new(),
        partitions,
        refreshed_us: None,
        unmapped: None,
    }
}

#[cfg(test)]
mod tests {
    use hvstats::snapshot::ObjectReading;

    use super::*;

    #[test]
    fn every_object_has_every_counter_with_a_distinct_value() {
        let instance = synthetic_instance(4, 3);
        assert_eq!(instance.partitions.len(), 4);
        assert_eq!(instance.partitions.iter().map(|p| p.vps.len()).sum::<usize>(), 12);
        let vp = &instance.partitions[2].vps[1];
        let ObjectReading::Counters(values) = &vp.reading else { panic!("{:?}", vp.reading) };
        assert_eq!(values.len(), counters_of(ObjectKind::Vp).count());
        assert_eq!(values[5].1, (2 * 3 + 1) * 1000 + 5);
    }
}
