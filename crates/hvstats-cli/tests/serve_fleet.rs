//! A host's fleet under `serve --observe-all`: a libvirt domain (its libvirtd the test's own), a
//! QEMU naming a QMP socket and a QEMU naming none, each running the same small guest from its
//! first instruction while observed. Every KVM statistic a source can reach is published for
//! each VM, equal to what KVM itself reports beside it (`virsh domstats`, QMP `query-stats`);
//! what no source reaches is null, never a 0; the guest's own work is counted exactly for all
//! three; the libvirt domain stays untainted. A libvirt domain whose QEMU is stopped loses its
//! libvirt counters (unavailable, not stale) and gets them back once it runs again.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Running, TempDir, kvm_available, total};
use hvstats_abi::catalog::{self, Counter};
use hvstats_abi::source::KvmStat;
use hvstats_abi::{ObjectKind, Presentation, Unit};
use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_testkit::{Libvirtd, kvm_vcpus};
use hvstats_vmm::qmp::{KvmStatsReply, Qmp, add_stats, stats_request};
use serde_json::Value;

/// The guest all three run: known work, then `cli; hlt` (its counts hold still afterwards).
fn program() -> BiosProgram {
    BiosProgram { cpuid: 300, out: 40, in_: 7, end: BiosEnd::Halt, ..BiosProgram::default() }
}

/// A paused QEMU with KVM running `bios`, killed on drop; its monitor (`cont`) is QMP on a
/// socket only the test holds (`control`), or the human monitor on its standard input.
struct Qemu {
    child: Child,
    control: Option<Qmp>,
}

impl Qemu {
    /// `observed_qmp`: a QMP socket on the command line for the observer to find.
    fn start(dir: &Path, name: &str, bios: &Path, observed_qmp: bool) -> Self {
        let mut command = Command::new("qemu-system-x86_64");
        command
            .args(["-accel", "kvm", "-S", "-display", "none", "-nodefaults", "-m", "16"])
            .args(["-name", &format!("guest={name},debug-threads=on")])
            .arg("-bios")
            .arg(bios);
        let control = dir.join(format!("{name}-control.sock"));
        if observed_qmp {
            let qmp = dir.join(format!("{name}.sock"));
            command.arg("-qmp").arg(format!("unix:{},server=on,wait=off", qmp.display()));
            command.arg("-qmp").arg(format!("unix:{},server=on,wait=off", control.display()));
        } else {
            command.args(["-monitor", "stdio"]);
        }
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 starts (.ci/run installs it)");
        let mut me = Self { child, control: None };
        let t = Instant::now();
        while (observed_qmp && !control.exists()) || kvm_vcpus(me.pid()) < 1 {
            assert!(t.elapsed() < Duration::from_secs(30), "QEMU {name} made no vCPU in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        if observed_qmp {
            me.control = Some(connect(&control));
        }
        me
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Lets the guest run.
    fn cont(&mut self) {
        match &mut self.control {
            Some(qmp) => qmp.cont().unwrap(),
            None => {
                let stdin = self.child.stdin.as_mut().unwrap();
                stdin.write_all(b"cont\n").unwrap();
                stdin.flush().unwrap();
            }
        }
    }

    /// KVM's statistics of the VM and its vCPUs, as QEMU reports them.
    fn kvm_stats(&mut self) -> KvmStatsReply {
        let qmp = self.control.as_mut().unwrap();
        let mut stats = KvmStatsReply::default();
        for target in ["vm", "vcpu"] {
            let reply = qmp.execute("query-stats", Some(stats_request(target, &[]))).unwrap();
            add_stats(&mut stats, target, &reply);
        }
        stats
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A QMP session on `path`; QEMU makes the file before it listens, so a refusal is tried again.
fn connect(path: &Path) -> Qmp {
    let t = Instant::now();
    loop {
        match Qmp::connect(path, Duration::from_secs(5)) {
            Ok(q) => return q,
            Err(e) if t.elapsed() < Duration::from_secs(10) => {
                eprintln!("QMP {}: {e}; again", path.display());
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("QMP {}: {e}", path.display()),
        }
    }
}

/// The partition named `name` in a snapshot of every instance.
fn partition<'a>(snapshot: &'a Value, name: &str) -> Option<&'a Value> {
    snapshot["instances"]
        .as_array()?
        .iter()
        .find_map(|i| i["partitions"].as_array()?.iter().find(|p| p["name"].as_str() == Some(name)))
}

/// The counter's value in `p` (VP 0 for a VP counter): `None` for null (declared unavailable).
fn value(p: &Value, counter: &Counter) -> Option<u64> {
    let counters = match counter.id.kind {
        ObjectKind::Vp => &p["vps"][0]["counters"],
        _ => &p["counters"],
    };
    let v = &counters[total(counter.name)];
    assert!(v.is_u64() || v.is_null(), "{}: {v}", counter.name);
    v.as_u64()
}

/// The source that writes `counter` in `p`, by the partition's source table.
fn writer<'a>(p: &'a Value, counter: &Counter) -> Option<&'a str> {
    let kind = if counter.id.kind == ObjectKind::Vp { "vp" } else { "partition" };
    p["sources"].as_array()?.iter().find_map(|s| {
        s[kind].as_array()?.iter().any(|c| c.as_str() == Some(counter.name)).then(|| s["name"].as_str())?
    })
}

/// Every catalog counter whose value is a sum of KVM statistics, with their names (histograms
/// are compared by their own tests: libvirt leaves them out, QMP gives them).
fn kvm_counters() -> Vec<(&'static Counter, &'static [&'static str])> {
    [ObjectKind::Vp, ObjectKind::Partition]
        .into_iter()
        .flat_map(catalog::counters_of)
        .filter(|c| c.presentation != Presentation::Histogram)
        .filter_map(|c| match catalog::observed_kvm_stat(c) {
            Some(KvmStat::Vcpu(names) | KvmStat::Vm(names)) => Some((c, names)),
            _ => None,
        })
        .collect()
}

/// The counter's value from KVM's statistics `get(object, name)`, `object` "vcpu" or "vm":
/// their sum, a time in its unit.
fn from_kvm(counter: &Counter, names: &[&str], get: impl Fn(&str, &str) -> Option<u64>) -> Option<u64> {
    let object = if counter.id.kind == ObjectKind::Vp { "vcpu" } else { "vm" };
    let sum = names.iter().map(|n| get(object, n)).sum::<Option<u64>>()?;
    Some(if counter.unit == Unit::Time100ns { sum / 100 } else { sum })
}

/// `virsh domstats` fields as KVM statistics of vCPU 0 or the VM.
fn domstats(stats: &BTreeMap<String, String>) -> impl Fn(&str, &str) -> Option<u64> + '_ {
    move |object, name| {
        let prefix = if object == "vcpu" { "vcpu.0" } else { "vm" };
        ["sum", "cur", "max"].iter().find_map(|s| stats.get(&format!("{prefix}.{name}.{s}")))?.parse().ok()
    }
}

/// QMP's statistics as KVM statistics of its only vCPU or the VM.
fn qmp_stats(stats: &KvmStatsReply) -> impl Fn(&str, &str) -> Option<u64> + '_ {
    move |object, name| match object {
        "vcpu" => stats.vcpus.values().next()?.get(name).copied(),
        _ => stats.vm.get(name).copied(),
    }
}

/// Takes a snapshot until `done` holds for it (at most two minutes); the last one.
fn snapshot_until(run: &Path, mut done: impl FnMut(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let s = common::snapshot_json(run);
        if done(&s) {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "not reached in two minutes:\n{s:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_libvirt_domain_and_two_qemus_under_serve_give_every_kvm_counter_kvm_reports() {
    if !kvm_available("a_libvirt_domain_and_two_qemus_under_serve_give_every_kvm_counter_kvm_reports") {
        return;
    }
    let Some(libvirtd) = Libvirtd::start("serve-fleet") else { return };
    let tmp = TempDir::new("serve-fleet");
    let program = program();
    let image = program.image().unwrap();
    let bios = tmp.path().join("bios.bin");
    std::fs::write(&bios, &image).unwrap();
    let tag = std::process::id();
    let (lv, with_qmp, plain) =
        (format!("fleet-lv-{tag}"), format!("fleet-qmp-{tag}"), format!("fleet-plain-{tag}"));
    let uuid = "7a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    let domain = libvirtd.start_domain(&lv, uuid, &image, true);
    let mut qemu_qmp = Qemu::start(tmp.path(), &with_qmp, &bios, true);
    let mut qemu_plain = Qemu::start(tmp.path(), &plain, &bios, false);

    // serve observes these three (the filter keeps other tests' VMs out), libvirt's statistics
    // through the test's libvirtd.
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let pids = [domain.pid, qemu_qmp.pid(), qemu_plain.pid()].map(|p| p.to_string());
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "1"];
    for pid in &pids {
        args.extend(["--vm", pid]);
    }
    let uri = format!("qemu:///system?socket={}", libvirtd.socket_ro().display());
    let serve = Running::start_with(&args, &run, &[("LIBVIRT_DEFAULT_URI", &uri)]);

    // All three attached, paused, with their vCPU threads known: only then do the guests run,
    // so what is counted from attach on is the guest's whole work.
    let names = [lv.as_str(), with_qmp.as_str(), plain.as_str()];
    let run_time = catalog::vp::TOTAL_RUN_TIME.counter().unwrap();
    snapshot_until(&run, |s| {
        names.iter().all(|n| partition(s, n).is_some_and(|p| value(p, run_time).is_some()))
    });
    libvirtd.virsh(&["resume", &lv]);
    qemu_qmp.cont();
    qemu_plain.cont();

    // The guests' own work, exactly, for all three.
    let cpuid = catalog::vp::CPUID_INSTRUCTIONS.counter().unwrap();
    let io = catalog::vp::IO_INSTRUCTIONS.counter().unwrap();
    let done = |s: &Value| {
        names.iter().all(|n| {
            partition(s, n).is_some_and(|p| {
                value(p, cpuid) == Some(u64::from(program.cpuid))
                    && value(p, io) == Some(u64::from(program.out + program.in_))
            })
        })
    };
    snapshot_until(&run, done);
    // Let the final HLT land and a refresh publish it.
    std::thread::sleep(Duration::from_secs(2));

    // Side by side with KVM's own report: before, the observer's page, after. A query of QEMU
    // 7.2 kicks the vCPU out of its halt (its wait and signal counts grow), so a counter lies
    // between the two reports; one that did not move equals both. A refresh whose QMP answer
    // missed its deadline (a host busy elsewhere) publishes QMP's counters as unavailable, not
    // stale: such a snapshot is taken again.
    let counters = kvm_counters();
    let given = |s: &Value, vm: &str| {
        partition(s, vm).is_some_and(|p| counters.iter().all(|(c, _)| value(p, c).is_some()))
    };
    let (mut before_lv, mut before_qmp, mut snapshot, mut after_lv, mut after_qmp);
    let mut tries = 0;
    loop {
        before_lv = libvirtd.domstats(&lv);
        before_qmp = qemu_qmp.kvm_stats();
        std::thread::sleep(Duration::from_millis(1500));
        snapshot = common::snapshot_json(&run);
        after_lv = libvirtd.domstats(&lv);
        after_qmp = qemu_qmp.kvm_stats();
        tries += 1;
        if (given(&snapshot, &lv) && given(&snapshot, &with_qmp)) || tries == 20 {
            break;
        }
    }
    assert!(done(&snapshot), "{snapshot:#}");

    assert!(counters.len() >= 10, "{} KVM counters in the catalog", counters.len());
    let mut compared = 0;
    for (vm, source, before, after) in [
        (
            &lv,
            "libvirt",
            Box::new(domstats(&before_lv)) as Box<dyn Fn(&str, &str) -> Option<u64>>,
            Box::new(domstats(&after_lv)) as Box<dyn Fn(&str, &str) -> Option<u64>>,
        ),
        (&with_qmp, "qmp", Box::new(qmp_stats(&before_qmp)), Box::new(qmp_stats(&after_qmp))),
    ] {
        let p = partition(&snapshot, vm).unwrap();
        for (counter, stats) in &counters {
            let lo = from_kvm(counter, stats, &before);
            let hi = from_kvm(counter, stats, &after);
            let (Some(lo), Some(hi)) = (lo, hi) else {
                panic!("{vm}: KVM reports no {stats:?} for {}", counter.name);
            };
            let got = value(p, counter).unwrap_or_else(|| panic!("{vm}: {} is null", counter.name));
            assert!(lo <= got && got <= hi, "{vm} {}: {lo} <= {got} <= {hi}", counter.name);
            // Written by a source that reads KVM's statistics whole-life: the VMM's own
            // descriptors where it keeps them open (QEMU 8.1 and later), else libvirt or QMP.
            let by = writer(p, counter);
            assert!(by == Some(source) || by == Some("stats-fd"), "{vm} {}: written by {by:?}", counter.name);
            compared += 1;
        }
        let hlt = catalog::vp::HLT_INSTRUCTIONS.counter().unwrap();
        assert_eq!(value(p, hlt), Some(1), "{vm}: the guest's one HLT");
    }
    assert_eq!(compared, 2 * counters.len());

    // The QEMU naming no QMP socket: where it keeps no statistics descriptor open (QEMU before
    // 8.1), no source outside it can read KVM's statistics (KVM answers only the VM's own
    // process; its debugfs holds VM sums and lockdown refuses it): those counters are null.
    let p = partition(&snapshot, &plain).unwrap();
    let stats_fd_up =
        p["sources"].as_array().unwrap().iter().any(|s| s["name"] == "stats-fd" && s["up"] == true);
    for (counter, _) in &counters {
        let (got, by) = (value(p, counter), writer(p, counter));
        match stats_fd_up {
            true => assert!(
                got.is_some() && by == Some("stats-fd"),
                "{plain} {}: {got:?} by {by:?}",
                counter.name
            ),
            false => assert!(got.is_none() && by.is_none(), "{plain} {}: {got:?} by {by:?}", counter.name),
        }
    }

    // The exporter says which source answers for which VM, and each VM's state.
    let metrics = serve.get("/metrics");
    let up = |vm: &str, source: &str| {
        common::sample(&metrics, &format!("hvstats_vm_source_up{{vm=\"{vm}\",source=\"{source}\"}}"))
    };
    assert_eq!(up(&lv, "libvirt").as_deref(), Some("1"), "{metrics}");
    assert_eq!(up(&with_qmp, "qmp").as_deref(), Some("1"), "{metrics}");
    assert_ne!(up(&plain, "qmp").as_deref(), Some("1"), "{metrics}");
    for vm in names {
        let state = common::sample(&metrics, &format!("hvstats_vm_state{{vm=\"{vm}\",state=\"running\"}}"));
        // The plain QEMU's state is unknown to hvstats (nothing there says it), never a guess.
        if vm != plain {
            assert_eq!(state.as_deref(), Some("1"), "{vm}: {metrics}");
        }
    }

    // Observed through a read-only connection, the domain is not tainted.
    let info = libvirtd.virsh(&["dominfo", &lv]);
    assert!(!info.contains("tainted"), "{info}");
    let xml = libvirtd.virsh(&["dumpxml", &lv]);
    assert!(!xml.contains("taint"), "{xml}");
}

#[test]
fn a_libvirt_domain_stopped_for_ten_seconds_loses_its_libvirt_counters_and_gets_them_back() {
    if !kvm_available(
        "a_libvirt_domain_stopped_for_ten_seconds_loses_its_libvirt_counters_and_gets_them_back",
    ) {
        return;
    }
    let Some(libvirtd) = Libvirtd::start("serve-fleet-stop") else { return };
    // SeaBIOS with no disk: it halts on a timer, a few dozen times a second, in KVM.
    let seabios =
        std::fs::read("/usr/share/seabios/bios-256k.bin").expect("QEMU's SeaBIOS (qemu-system-x86)");
    let lv = format!("fleet-stop-{}", std::process::id());
    let domain = libvirtd.start_domain(&lv, "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e", &seabios, false);
    let tmp = TempDir::new("serve-fleet-stop");
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let uri = format!("qemu:///system?socket={}", libvirtd.socket_ro().display());
    let pid = domain.pid.to_string();
    let args = ["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "1", "--vm", &pid];
    let serve = Running::start_with(&args, &run, &[("LIBVIRT_DEFAULT_URI", &uri)]);
    let up = format!("hvstats_vm_source_up{{vm=\"{lv}\",source=\"libvirt\"}}");
    let hlt = format!("hvstats_vp_intercepts_total{{vm=\"{lv}\",vp=\"0\",intercept=\"hlt\"}}");
    let halts = |m: &str| common::sample(m, &hlt).and_then(|v| v.parse::<u64>().ok());
    let m = serve.metrics_until(Duration::from_secs(120), |m| {
        common::sample(m, &up).as_deref() == Some("1") && halts(m).is_some_and(|h| h > 0)
    });
    let before = halts(&m).unwrap();

    // Stopped: libvirt cannot answer for it; its counters are unavailable, not stale.
    // SAFETY: kill has no memory effects; the pid is the domain's QEMU.
    assert_eq!(unsafe { libc::kill(domain.pid, libc::SIGSTOP) }, 0);
    let stopped_at = Instant::now();
    let m = serve.metrics_until(Duration::from_secs(10), |m| common::sample(m, &up).as_deref() == Some("0"));
    assert_eq!(halts(&m), None, "{m}");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(stopped_at.elapsed()));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(domain.pid, libc::SIGCONT) }, 0);
    let continued = Instant::now();
    serve.metrics_until(Duration::from_secs(60), |m| common::sample(m, &up).as_deref() == Some("1"));
    eprintln!("libvirt back {:.1} s after SIGCONT", continued.elapsed().as_secs_f64());
    let m = serve.metrics_until(Duration::from_secs(30), |m| halts(m).is_some_and(|h| h > before));
    assert!(halts(&m).unwrap() > before);
    // One line each way.
    let lines = serve.lines_with(&format!("\"{lv}\": libvirt"));
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].contains("libvirt lost") && lines[0].contains("did not answer within"), "{lines:#?}");
    assert!(lines[1].contains("libvirt back after"), "{lines:#?}");
    drop(serve);
    let info = libvirtd.virsh(&["dominfo", &lv]);
    assert!(!info.contains("tainted"), "{info}");
}
