//! Random allocate/free sequences against a reference model of who holds what.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod hwc_support;

use hvstats_abi::hal::{NtStatus, PhysicalCounterResourceDescriptor as D, PhysicalCounterResourceList};
use hvstats_hwc::{CounterSetHandle, CpuSet};
use hwc_support::{Key, Model, TempRuntime, allocator};
use proptest::prelude::*;

/// Processors chosen to straddle group boundaries of the 128-processor PMU.
const CPUS: [u32; 6] = [0, 1, 63, 64, 65, 127];

#[derive(Clone, Debug)]
enum Op {
    /// `cpus`: indices into [`CPUS`] (empty = no affinity, all processors); `list`: `None` = the
    /// whole PMU.
    Alloc { cpus: Vec<usize>, list: Option<Vec<D>> },
    /// Frees the n-th handle handed out so far (modulo their number), or a handle never given.
    Free { nth: usize, bogus: bool },
}

fn descriptor() -> impl Strategy<Value = D> {
    prop_oneof![
        (0u32..9).prop_map(D::single),
        (0u32..9, 0u32..3).prop_map(|(a, n)| D::range(a, (a + n).min(8))),
        Just(D::overflow(0x1000)),
        Just(D::event_buffer(0x2000, 0, 16)),
        (0u32..3).prop_map(D::identification_tag),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            proptest::collection::vec(0..CPUS.len(), 0..3),
            proptest::option::weighted(0.85, proptest::collection::vec(descriptor(), 1..4)),
        )
            .prop_map(|(cpus, list)| Op::Alloc { cpus, list }),
        2 => (any::<usize>(), proptest::bool::weighted(0.1)).prop_map(|(nth, bogus)| Op::Free { nth, bogus }),
    ]
}

/// The model's own reading of a descriptor list (not the allocator's).
fn model_keys(list: &Option<Vec<D>>) -> Vec<Key> {
    let Some(list) = list else { return vec![Key::Whole] };
    let mut keys = Vec::new();
    for d in list {
        let new: Vec<Key> = match d.resource_type.0 {
            0 => vec![Key::Counter(d.u[0])],
            1 => (d.u[0]..=d.u[1]).map(Key::Counter).collect(),
            3 => vec![Key::Overflow],
            4 => vec![Key::EventBuffer],
            5 => vec![Key::Tag(d.u[0])],
            t => unreachable!("the strategy makes no type {t}"),
        };
        for k in new {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn allocator_agrees_with_the_reference_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = TempRuntime::new("hwc-model");
        let a = allocator(&rt);
        let mut model = Model::default();
        let mut given: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { cpus, list } => {
                    let cpus: Vec<u32> = if cpus.is_empty() {
                        (0..128).collect()
                    } else {
                        let mut c: Vec<u32> = cpus.iter().map(|&i| CPUS[i]).collect();
                        c.sort_unstable();
                        c.dedup();
                        c
                    };
                    let affinity = CpuSet::from_iter(cpus.iter().copied()).to_group_affinities();
                    let affinity = (cpus.len() < 128).then_some(affinity.as_slice());
                    let l = list.as_deref().map(PhysicalCounterResourceList::new);
                    let keys = model_keys(&list);
                    let expected = model.can_grant(&cpus, &keys);
                    match a.allocate(affinity, l.as_ref()) {
                        Ok(h) => {
                            prop_assert!(expected, "granted {keys:?} on {cpus:?} though the model holds it");
                            prop_assert!(!given.contains(&h.raw()), "handle {h} given twice");
                            model.grant(h.raw(), &cpus, &keys).map_err(TestCaseError::fail)?;
                            given.push(h.raw());
                        }
                        Err(s) => {
                            prop_assert_eq!(s, NtStatus::INSUFFICIENT_RESOURCES);
                            prop_assert!(!expected, "refused {:?} on {:?} though it is free", keys, cpus);
                        }
                    }
                }
                Op::Free { nth, bogus } => {
                    let h = if bogus || given.is_empty() { 1_000_000 + nth as u64 % 1000 } else { given[nth % given.len()] };
                    let expected = if model.release(h) { NtStatus::SUCCESS } else { NtStatus::INVALID_PARAMETER };
                    prop_assert_eq!(a.free(CounterSetHandle::from_raw(h)), expected);
                }
            }
            let held: Vec<u64> = a.allocations().unwrap().iter().map(|x| x.handle.raw()).collect();
            prop_assert_eq!(held, model.handles());
        }
    }
}
