//! `serve --observe-all` killed with SIGKILL (or stopped with SIGTERM) under a running QEMU, then
//! a new one: the VM is back, and each of its counters either continues (KVM's own, counted from
//! the vCPU's creation; the tracepoints' counts, kept in the kernel by bpffs pins while no
//! observer ran and adopted by the new one; the vCPU threads' run time, CPU wait and dispatches,
//! and migrations, which the kernel keeps from the thread's start and the task iterator reads) or
//! says its reset (what is counted from the new observer's attach, with a later `_created`, a
//! later `hvstats_vm_counting_since_seconds` and a later `counting_since` in `snapshot --json`).
//! A real Prometheus scraping through the restart sees the same.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{QemuGuest, Running, TempDir, counter_series, kvm_available};
use serde_json::Value;

/// `serve --observe-all` of the VM of `pid` only (other tests' VMMs are theirs), refreshing
/// twice a second, with each counter's `_created`.
fn serve(run: &Path, pid: i32, listen: &str) -> Running {
    let pid = pid.to_string();
    Running::start(
        &[
            "serve",
            "--listen",
            listen,
            "--observe-all",
            "--observe-interval",
            "0.5",
            "--vm",
            &pid,
            "--collector.created",
        ],
        run,
    )
}

fn sigkill(serve: &mut Running) {
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
}

/// The value of the VM's `hvstats_vm_counting_since_seconds`.
fn counting_since(metrics: &str, vm: &str) -> Option<f64> {
    common::sample(metrics, &format!("hvstats_vm_counting_since_seconds{{vm=\"{vm}\"}}"))?.parse().ok()
}

/// The VM's `tracepoints` source in `snapshot --json` of `run`, once it says its counts are kept
/// (every vCPU thread known and counted in a kept row).
fn tracepoints_kept(run: &Path, vm: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let snapshot = common::snapshot_json(run);
        let source = snapshot["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|i| i["partitions"].as_array().into_iter().flatten())
            .filter(|p| p["name"] == vm)
            .flat_map(|p| p["sources"].as_array().into_iter().flatten())
            .find(|s| s["name"] == "tracepoints")
            .cloned();
        if let Some(source) = source.filter(|s| s["counts_from"] == "kept") {
            return source;
        }
        assert!(Instant::now() < deadline, "the tracepoints' counts are not kept: {snapshot:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn instance_files(run: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run.join("instances"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_new_serve_after_a_sigkill_shows_the_vm_and_every_counter_continues_or_says_its_reset() {
    if !kvm_available("a_new_serve_after_a_sigkill_shows_the_vm_and_every_counter_continues") {
        return;
    }
    let tmp = TempDir::new("restart-said");
    let tag = format!("restart-{}", std::process::id());
    let qemu = QemuGuest::start(tmp.path(), &tag);
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let io = format!("hvstats_vp_intercepts{{vm=\"{tag}\",vp=\"0\",intercept=\"io\"");
    let counted = |m: &str| counter_series(m, &tag).get(&format!("{io}}}")).is_some_and(|(v, _)| *v > 0.0);

    let mut first = serve(&run, qemu.pid(), "127.0.0.1:0");
    first.wait_line(&format!("attach pid {}", qemu.pid()));
    let kept = tracepoints_kept(&run, &tag);
    // SeaBIOS touches ports within seconds here, longer on a host busy emulating others.
    let before = first.openmetrics_until(Duration::from_secs(120), counted);
    let since_before = counting_since(&before, &tag).unwrap();
    let old = instance_files(&run);
    sigkill(&mut first);
    assert_eq!(instance_files(&run), old, "a SIGKILL leaves its instance behind");

    let started = Instant::now();
    let second = serve(&run, qemu.pid(), "127.0.0.1:0");
    second.wait_line("in-kernel counts: adopted the in-kernel counts of");
    // Its sources attach one after another: wait for the port accesses and nine more series.
    let after = second.openmetrics_until(Duration::from_secs(60), |m| {
        let series = counter_series(m, &tag);
        counting_since(m, &tag).is_some() && series.contains_key(&format!("{io}}}")) && series.len() >= 10
    });
    eprintln!("the VM was back in the new serve's /metrics {:?} after it started", started.elapsed());
    let since_after = counting_since(&after, &tag).unwrap();
    assert!(since_after > since_before, "a new origin: {since_before} then {since_after}");

    let (was, now) = (counter_series(&before, &tag), counter_series(&after, &tag));
    assert!(now.len() >= 10, "{after}");
    let (mut continued, mut reset) = (0, 0);
    for (series, &(value, created)) in &now {
        // Every counter series of the VM says from when it counts.
        let created = created.unwrap_or_else(|| panic!("{series} has no _created:\n{after}"));
        assert!(!value.is_nan(), "{series}: a _created without its _total");
        let Some(&(old_value, old_created)) = was.get(series) else { continue };
        let old_created = old_created.unwrap();
        if created == old_created {
            // Counted by KVM since the vCPU's creation, or kept in the kernel since the first
            // attach: it goes on, never back.
            assert!(created < since_after, "{series} created {created}");
            assert!(value >= old_value, "{series} went back from {old_value} to {value} unsaid");
            continued += 1;
        } else {
            // Counted since the attach: the new observer's attach, said.
            assert_eq!((old_created, created), (since_before, since_after), "{series}");
            reset += 1;
        }
    }
    // The threads' run time, CPU wait and dispatches, kept by the kernel since the thread
    // started: they continue, from the VM's start.
    for family in ["hvstats_vp_total_run_seconds", "hvstats_vp_cpu_wait_seconds", "hvstats_vp_dispatches"] {
        let series = format!("{family}{{vm=\"{tag}\",vp=\"0\"}}");
        let ((was_value, was_created), (now_value, now_created)) = (was[&series], now[&series]);
        assert!(now_value >= was_value && was_value > 0.0, "{series}: {was_value} then {now_value}");
        assert_eq!(was_created, now_created, "{series}");
        assert!(now_created.unwrap() < since_before, "{series} counts from before the first attach");
    }
    // The port accesses were counted in the kernel all along: kept since the first attach, and
    // more now than before the SIGKILL (the guest went on while no observer ran).
    let (io_was, io_now) = (was[&format!("{io}}}")], now[&format!("{io}}}")]);
    let kept_since = kept["counts_since"].as_f64().unwrap();
    assert_eq!(
        (io_was.1, io_now.1),
        (Some(kept_since), Some(kept_since)),
        "io counts kept since the first attach"
    );
    assert!(io_now.0 >= io_was.0, "io went from {} to {}", io_was.0, io_now.0);
    eprintln!("{continued} counter series continued, {reset} said their reset");

    // The snapshot says the same origins, and the dead observer's instance is gone.
    let snapshot = common::snapshot_json(&run);
    let partitions: Vec<&Value> = snapshot["instances"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["partitions"].as_array().unwrap())
        .filter(|p| p["name"] == tag.as_str())
        .collect();
    assert_eq!(partitions.len(), 1, "{snapshot}");
    let p = partitions[0];
    assert!((p["counting_since"].as_f64().unwrap() - since_after).abs() < 1e-5, "{p}");
    let sources = p["sources"].as_array().unwrap();
    let tracepoints = sources.iter().find(|s| s["name"] == "tracepoints").unwrap();
    assert_eq!(
        (tracepoints["counts_from"].as_str(), tracepoints["counts_since"].as_f64()),
        (Some("kept"), Some(kept_since))
    );
    // The threads' accounting, the migrations with it, is the kernel's from the thread's start,
    // which came with the VM's: read by the task iterator, no thread clock counts from attach.
    let thread = sources.iter().find(|s| s["name"] == "thread-iter").unwrap();
    assert_eq!(thread["counts_from"], "thread-start", "{thread}");
    assert!(thread["counts_since"].as_f64().unwrap() < since_before, "{thread}");
    for counter in
        ["Total run time", "CPU wait time per dispatch", "Dispatches/sec", "Logical processor migrations/sec"]
    {
        assert!(thread["vp"].as_array().unwrap().iter().any(|c| c == counter), "{counter}: {thread}");
    }
    assert!(sources.iter().all(|s| s["name"] != "thread-clock" && s["name"] != "thread"), "{p}");
    for s in sources.iter().filter(|s| s["counts_from"] == "vcpu-creation") {
        assert!(s["counts_since"].as_f64().unwrap() < since_before, "{s}");
    }
    let now_files = instance_files(&run);
    assert!(old.iter().all(|f| !now_files.contains(f)), "stale {old:?} still in {now_files:?}");
}

/// Prometheus' answer to a `query` at `at` (Unix seconds): each series' labels and value.
fn query(prometheus: SocketAddr, q: &str, at: f64) -> Result<Vec<(Value, f64)>, String> {
    if std::net::TcpStream::connect(prometheus).is_err() {
        return Err("not listening yet".into());
    }
    let path = format!("/api/v1/query?query={}&time={at}", common::url_encoded(q));
    let reply = common::http_get(prometheus, &path);
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {reply}"))?;
    let result = v["data"]["result"].as_array().ok_or(format!("{v}"))?;
    Ok(result
        .iter()
        .filter_map(|r| Some((r["metric"].clone(), r["value"][1].as_str()?.parse().ok()?)))
        .collect())
}

/// The one value of `q` at `at` (else now), waiting (2 minutes at most) for Prometheus to have it.
fn one(prometheus: SocketAddr, q: &str, at: Option<f64>) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match query(prometheus, q, at.unwrap_or_else(now)) {
            Ok(r) if r.len() == 1 => return r[0].1,
            Ok(r) if Instant::now() > deadline => panic!("{q}: {r:?}"),
            Err(e) if Instant::now() > deadline => panic!("{q}: {e}"),
            _ => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn prometheus_sees_a_continuing_counter_continue_and_a_reset_one_say_its_reset_across_a_restart() {
    let test = "prometheus_sees_a_continuing_counter_continue_and_a_reset_one_say_its_reset";
    let Some(prometheus) = common::prometheus_tool("prometheus", test) else { return };
    if !kvm_available(test) {
        return;
    }
    let (tmp, work) = (TempDir::new("restart-prom"), TempDir::new("restart-prom-work"));
    let tag = format!("prom-restart-{}", std::process::id());
    let qemu = QemuGuest::start(tmp.path(), &tag);
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    // One address for both observers, as a Prometheus target is.
    let listen = format!("127.0.0.1:{}", common::free_port());
    let mut first = serve(&run, qemu.pid(), &listen);
    first.wait_line(&format!("attach pid {}", qemu.pid()));
    let kept_since = tracepoints_kept(&run, &tag)["counts_since"].as_f64().unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hvstats\n    static_configs:\n      - targets: ['{listen}']\n"
    );
    let (_prometheus, web) = common::start_prometheus(prometheus, &config, work.path());
    let hlt = format!("hvstats_vp_intercepts_total{{vm=\"{tag}\",intercept=\"hlt\"}}");
    let io = format!("hvstats_vp_intercepts_total{{vm=\"{tag}\",intercept=\"io\"}}");
    let since = format!("hvstats_vm_counting_since_seconds{{vm=\"{tag}\"}}");
    // Five scrapes of the first observer with halts and port accesses counted.
    let t0 = now();
    let deadline = Instant::now() + Duration::from_secs(180);
    while one(web, &format!("count_over_time({hlt}[1h])"), None) < 5.0
        || one(web, &format!("max_over_time({io}[1h])"), None) <= 0.0
    {
        assert!(Instant::now() < deadline, "Prometheus did not scrape the first observer's counts");
        std::thread::sleep(Duration::from_millis(500));
    }
    let since_before = one(web, &since, None);
    sigkill(&mut first);
    let killed = now();
    let second = serve(&run, qemu.pid(), &listen);
    second.wait_line(&format!("attach pid {}", qemu.pid()));
    // Five scrapes of the second observer.
    let scrapes_since_kill = || {
        let q = format!("count_over_time({since}[{}ms])", ((now() - killed) * 1000.0) as u64);
        query(web, &q, now()).ok().and_then(|r| r.first().map(|(_, v)| *v)).unwrap_or(0.0)
    };
    while scrapes_since_kill() < 5.0 {
        assert!(Instant::now() < deadline, "Prometheus did not scrape the second observer");
        std::thread::sleep(Duration::from_millis(500));
    }
    let end = now();
    let window = format!("{}s", (end - t0).ceil() as u64 + 1);
    let since_after = one(web, &since, Some(end));
    assert!(since_after > since_before, "{since_before} then {since_after}");
    // The VM's origin changed once in Prometheus: the restart is visible.
    assert_eq!(one(web, &format!("changes({since}[{window}])"), Some(end)), 1.0);
    // KVM's halts (QMP, counted since the vCPU's creation) continue: no reset, so rate() sees
    // neither a drop to 0 nor a spike.
    assert_eq!(one(web, &format!("resets({hlt}[{window}])"), Some(end)), 0.0);
    // The port accesses (tracepoints) were counted in the kernel while no observer ran, and the
    // new observer adopted those counts: no reset either, and their origin stays the first
    // attach.
    assert_eq!(one(web, &format!("resets({io}[{window}])"), Some(end)), 0.0);
    // Prometheus 2.42 reads no `_created`: it keeps each as a series of its own, which never
    // moved.
    let created = format!("hvstats_vp_intercepts_created{{vm=\"{tag}\",intercept=\"io\"}}");
    assert_eq!(one(web, &created, Some(end)), kept_since);
    assert_eq!(one(web, &format!("changes({created}[{window}])"), Some(end)), 0.0);
    // The threads' run time is the kernel's since the thread started: no reset, and its origin
    // never moved.
    let run = format!("hvstats_vp_total_run_seconds_total{{vm=\"{tag}\",vp=\"0\"}}");
    assert_eq!(one(web, &format!("resets({run}[{window}])"), Some(end)), 0.0);
    let run_created = format!("hvstats_vp_total_run_seconds_created{{vm=\"{tag}\",vp=\"0\"}}");
    assert!(one(web, &run_created, Some(end)) < since_before);
    assert_eq!(one(web, &format!("changes({run_created}[{window}])"), Some(end)), 0.0);
    // The rates through the restart, for people reading the log.
    for (name, series) in [("hlt", &hlt), ("io", &io)] {
        let rates: Vec<String> = (0..=((end - t0) as u64))
            .map(|s| t0 + s as f64)
            .map(|at| {
                let q = format!("rate({series}[3s])");
                query(web, &q, at)
                    .ok()
                    .and_then(|r| r.first().map(|(_, v)| format!("{v:.1}")))
                    .unwrap_or("-".into())
            })
            .collect();
        eprintln!("rate({name}[3s]) each second, SIGKILL at +{:.1} s: {}", killed - t0, rates.join(" "));
    }
}

/// The layouts kept for `run` in bpffs, each with its pins.
fn kept_layouts(run: &Path) -> Vec<(String, Vec<String>)> {
    let identity = hvstats_host::bpf::keep::identity_dir(run).unwrap();
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    names(&identity).into_iter().map(|layout| (layout.clone(), names(&identity.join(layout)))).collect()
}

#[test]
fn a_serve_stopped_cleanly_leaves_its_counts_to_the_next_and_a_vm_gone_meanwhile_takes_them_along() {
    if !kvm_available("a_serve_stopped_cleanly_leaves_its_counts_to_the_next") {
        return;
    }
    let tmp = TempDir::new("restart-kept");
    let tag = format!("kept-{}", std::process::id());
    let qemu = QemuGuest::start(tmp.path(), &tag);
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();

    // A clean stop (an upgrade, a restart by the service manager): the counts stay pinned.
    let mut first = serve(&run, qemu.pid(), "127.0.0.1:0");
    first.wait_line(&format!("attach pid {}", qemu.pid()));
    let kept = tracepoints_kept(&run, &tag);
    let thread_counts = |m: &str| -> Option<[f64; 3]> {
        let series = counter_series(m, &tag);
        let value = |family: &str| series.get(&format!("{family}{{vm=\"{tag}\",vp=\"0\"}}")).map(|(v, _)| *v);
        Some([
            value("hvstats_vp_total_run_seconds")?,
            value("hvstats_vp_cpu_wait_seconds")?,
            value("hvstats_vp_dispatches")?,
        ])
    };
    let m =
        first.openmetrics_until(Duration::from_secs(60), |m| thread_counts(m).is_some_and(|c| c[2] > 0.0));
    let before = thread_counts(&m).unwrap();
    assert!(first.terminate().success());
    let layouts = kept_layouts(&run);
    assert_eq!(layouts.len(), 1, "{layouts:?}");
    let pins = &layouts[0].1;
    for pin in ["owners", "rows", "threads"] {
        assert!(pins.iter().any(|p| p == pin), "{pin} not pinned: {pins:?}");
    }
    assert!(pins.iter().any(|p| p.starts_with("link:kvm:")), "no program pinned: {pins:?}");

    // The next serve adopts them: the same origin.
    let mut second = serve(&run, qemu.pid(), "127.0.0.1:0");
    second.wait_line("in-kernel counts: adopted the in-kernel counts of");
    second.wait_line(&format!("attach pid {}", qemu.pid()));
    let adopted = tracepoints_kept(&run, &tag);
    assert_eq!(adopted["counts_since"], kept["counts_since"], "{adopted} after {kept}");
    // Run time, CPU wait and dispatches go on from where the first observer left them (the
    // kernel kept them while no observer ran), never from 0.
    let m = second.openmetrics_until(Duration::from_secs(60), |m| thread_counts(m).is_some());
    let after = thread_counts(&m).unwrap();
    assert!(
        (0..3).all(|i| after[i] >= before[i]),
        "run time, CPU wait, dispatches: {before:?} then {after:?}"
    );
    eprintln!("run time, CPU wait, dispatches across a SIGTERM: {before:?} then {after:?}");
    assert!(second.terminate().success());

    // The VM ends while no observer runs: the next start drops its rows and says so, and once
    // that observer ends with nothing to count, nothing of it stays pinned.
    drop(qemu);
    let mut third = serve(&run, std::process::id() as i32, "127.0.0.1:0");
    let line = third.wait_line("in-kernel counts: dropped the kept counts of");
    assert!(line.contains("gone while no observer ran"), "{line}");
    assert!(third.terminate().success());
    assert_eq!(kept_layouts(&run), Vec::<(String, Vec<String>)>::new(), "pins outlived their VM");
    hvstats_host::bpf::keep::remove_tree(&hvstats_host::bpf::keep::identity_dir(&run).unwrap());
}
