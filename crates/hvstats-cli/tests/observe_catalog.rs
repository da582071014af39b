//! The catalog says, per counter, whether it is maintained for observed VMs and from what.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::process::Command;

use hvstats_abi::CATALOG;
use hvstats_abi::Maintained;
use hvstats_abi::catalog::observed;
use serde_json::Value;

#[test]
fn catalog_json_and_table_carry_the_observed_column() {
    let o = Command::new(env!("CARGO_BIN_EXE_hvstats")).args(["catalog", "--json"]).output().unwrap();
    assert!(o.status.success());
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = doc["counters"].as_array().unwrap();
    assert_eq!(rows.len(), CATALOG.len());
    for (row, c) in rows.iter().zip(CATALOG) {
        match observed(c) {
            Some(Maintained::By(source, note)) => {
                assert_eq!(row["observed"], source.name(), "{}", c.name);
                assert_eq!(row["observed_note"], note);
            }
            Some(Maintained::No(why)) => {
                assert_eq!(row["observed"], "no", "{}", c.name);
                assert_eq!(row["observed_note"], why);
            }
            None => assert!(row["observed"].is_null() && row["observed_note"].is_null(), "{}", c.name),
        }
    }
    let by_name = |object: &str, name: &str| {
        rows.iter()
            .find(|r| r["object"] == object && r["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    assert_eq!(by_name("vp", "CPUID instructions/sec")["observed"], "tracepoint");
    assert_eq!(by_name("vp", "HLT instructions/sec")["observed"], "kvm-stats");
    assert_eq!(by_name("vp", "MWAIT instructions/sec")["observed"], "kvm-exit");
    assert_eq!(by_name("vp", "IO intercept messages/sec")["observed"], "userspace-exit");
    assert_eq!(by_name("vp", "CPUID instructions cost")["observed"], "kvm-exit-time");
    assert_eq!(by_name("vp", "Emulated instructions cost")["observed"], "no");
    // A Windows guest's Hyper-V counters: KVM's Hyper-V emulation, from its kvm_hv tracepoints.
    for name in ["Long spin wait hypercalls/sec", "Synthetic interrupts/sec", "Local flushed GVA ranges/sec"]
    {
        assert_eq!(by_name("vp", name)["observed"], "kvm-hv", "{name}");
    }
    assert_eq!(by_name("hypervisor", "Partitions")["observed"], Value::Null);

    let o = Command::new(env!("CARGO_BIN_EXE_hvstats")).arg("catalog").output().unwrap();
    let text = String::from_utf8(o.stdout).unwrap();
    let header = text.lines().next().unwrap();
    assert!(header.contains("  OBSERVED  "), "{header}");
    let cpuid = text.lines().find(|l| l.starts_with("vp") && l.contains("CPUID instructions/sec")).unwrap();
    assert!(cpuid.contains("  tracepoint  "), "{cpuid}");
}
