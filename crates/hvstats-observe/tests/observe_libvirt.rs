//! A libvirt domain observed through libvirt's bulk statistics: a libvirtd of the test's own,
//! one domain running a small guest under QEMU on KVM, every KVM counter read side by side with
//! `virsh domstats`, and the domain not tainted by it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::{self, Counter};
use hvstats_abi::source::KvmStat;
use hvstats_abi::vm_sources::{Origin, SourceTable};
use hvstats_abi::{ObjectKind, Presentation, Unit};
use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets};
use hvstats_testkit::Libvirtd;
use observe_support::kvm_available;

/// The counter's value from `virsh domstats` fields of vCPU 0 (or the VM): the sum of its
/// statistics, a time in its unit; `None` when virsh lacks one of them.
fn from_domstats(counter: &Counter, names: &[&str], stats: &BTreeMap<String, String>) -> Option<u64> {
    let prefix = if counter.id.kind == ObjectKind::Vp { "vcpu.0" } else { "vm" };
    let mut sum = 0u64;
    for name in names {
        let v = ["sum", "cur", "max"].iter().find_map(|s| stats.get(&format!("{prefix}.{name}.{s}")))?;
        sum += v.parse::<u64>().ok()?;
    }
    Some(if counter.unit == Unit::Time100ns { sum / 100 } else { sum })
}

#[test]
fn a_libvirt_domain_gives_every_kvm_counter_as_virsh_domstats_shows_it_and_stays_untainted() {
    if !kvm_available(
        "a_libvirt_domain_gives_every_kvm_counter_as_virsh_domstats_shows_it_and_stays_untainted",
    ) {
        return;
    }
    let Some(libvirtd) = Libvirtd::start("libvirt-stats") else { return };
    let program = BiosProgram { cpuid: 50, out: 20, end: BiosEnd::Halt, ..BiosProgram::default() };
    let name = format!("hvstats-test-{}", std::process::id());
    let uuid = "3d9c1b2a-7e6f-4a5b-9c8d-1e2f3a4b5c6d";
    let domain = libvirtd.run_domain(&name, uuid, &program.image().unwrap());
    assert!(!libvirtd.virsh(&["dominfo", &name]).contains("tainted"), "untainted before");

    let tmp = observe_support::TempDir::new("libvirt-observer");
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let options = ObserveOptions { libvirt: Some(libvirtd.socket_ro()), ..Default::default() };
    let mut observer = Observer::new(hv.clone(), Procfs::host(), Targets::Pids(vec![domain.pid]), options);
    // The guest ends halted (interrupts off): wait until its halt shows, so its counts hold still.
    let t = Instant::now();
    loop {
        observer.tick();
        let halted = libvirtd.domstats(&name).get("vcpu.0.halt_exits.sum").is_some_and(|v| v != "0");
        if halted && observer.vms().next().is_some_and(|v| v.vcpu_threads().iter().all(Option::is_some)) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the guest did not halt in 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Side by side: virsh before, the observer, virsh after. Each query of QEMU 7.2 kicks the
    // vCPU out of its halt (halt_wait_ns, signal_exits grow), so a counter lies between the two
    // readings; one that did not move between them equals both.
    let before = libvirtd.domstats(&name);
    observer.tick();
    let after = libvirtd.domstats(&name);
    let vm = observer.vms().next().unwrap();
    assert_eq!(vm.name(), name, "the domain's name, from libvirt");
    let part = hv.partitions()[0].clone();
    let page = part.vp_page(0).unwrap();
    let unavailable = vm.unavailable();
    let mut compared = Vec::new();
    for kind in [ObjectKind::Vp, ObjectKind::Partition] {
        for counter in catalog::counters_of(kind) {
            let Some(KvmStat::Vcpu(names) | KvmStat::Vm(names)) = catalog::observed_kvm_stat(counter) else {
                continue;
            };
            if counter.presentation == Presentation::Histogram {
                // libvirt 9 leaves KVM's histograms out: declared unavailable, never a 0.
                assert!(unavailable.contains(&counter.id), "{}", counter.name);
                continue;
            }
            let (Some(lo), Some(hi)) =
                (from_domstats(counter, names, &before), from_domstats(counter, names, &after))
            else {
                panic!("virsh domstats lacks a statistic of {}", counter.name);
            };
            let got = if kind == ObjectKind::Vp { page.get(counter.id) } else { part.page().get(counter.id) };
            assert!(lo <= got && got <= hi, "{}: {lo} <= {got} <= {hi}", counter.name);
            assert!(!unavailable.contains(&counter.id), "{}", counter.name);
            assert_eq!(vm.source_of(counter.id), Some("libvirt"), "{}", counter.name);
            compared.push((counter.name, got));
        }
    }
    let count = |n: &str| compared.iter().find(|(c, _)| *c == n).map(|(_, v)| *v);
    assert_eq!(count("HLT instructions/sec"), Some(1), "the guest's one halt");
    assert!(count("Emulated instructions/sec").unwrap() > 50, "{compared:?}");
    // Readers see libvirt as the writer of KVM's counters, counting from the vCPU's creation.
    let table = SourceTable::decode(|id| Some(part.page().get(id))).unwrap();
    let writer = table.writer(catalog::vp::HLT_INSTRUCTIONS).unwrap();
    assert_eq!((writer.name(), writer.up, writer.origin), ("libvirt", true, Origin::VcpuCreation));
    // A read-only connection leaves the domain untainted.
    let info = libvirtd.virsh(&["dominfo", &name]);
    assert!(!info.contains("tainted"), "{info}");
    let xml = libvirtd.virsh(&["dumpxml", &name]);
    assert!(!xml.contains("taint"), "{xml}");
}
