//! The monitoring mixin (packaging/prometheus, packaging/grafana) against Debian's Prometheus:
//! promtool checks the rules and runs their unit tests (one firing case per alert), the
//! dashboard has what Grafana reads, and a real Prometheus scraping two real `hvstats serve`s
//! with the rules loaded answers every query of the dashboard with series.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{KilledOnDrop, TempDir, http_get, prometheus_tool, start_prometheus, url_encoded};
use hvstats_testkit::{spawn_qemu, wait_for_kvm_vcpus};
use serde_json::Value;

fn packaging(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging").join(path)
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(packaging("grafana/hvstats.json")).unwrap()).unwrap()
}

/// Series only an observer of other processes' VMs exports (its health, and its VMs' sources).
/// Where a VM is observed (KVM and QEMU here) the exporter must export each, and the dashboard's
/// queries that read them are checked like every other; on a host where none can be, those
/// queries cannot return data and are left out.
const OBSERVER_SERIES: [&str; 5] = [
    "hvstats_vm_source_up",
    "hvstats_observer_up",
    "hvstats_observer_last_refresh_timestamp_seconds",
    "hvstats_observer_vms",
    "hvstats_observer_qmp_sessions_up",
];

/// `promtool` with `args` in packaging/prometheus: (success, what it said).
fn promtool(promtool: &str, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(promtool).args(args).current_dir(dir).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

/// The names of the alerts in an alerting rules file (`- alert: Name`).
fn alerts_in(yaml: &str) -> Vec<String> {
    yaml.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).map(str::to_owned).collect()
}

#[test]
fn promtool_checks_the_rules_and_every_alert_has_a_firing_unit_test() {
    let Some(promtool_path) = prometheus_tool("promtool", "promtool_checks_the_rules") else { return };
    let dir = packaging("prometheus");
    let (ok, said) =
        promtool(promtool_path, &dir, &["check", "rules", "hvstats.rules.yml", "hvstats.alerts.yml"]);
    assert!(ok, "{said}");
    assert!(said.contains("SUCCESS: 19 rules found") && said.contains("SUCCESS: 10 rules found"), "{said}");
    let (ok, said) = promtool(promtool_path, &dir, &["test", "rules", "hvstats.test.yml"]);
    assert!(ok && said.contains("SUCCESS"), "{said}");

    // Each alert has a case in which it fires (an alert_rule_test with exp_alerts).
    let alerts = alerts_in(&std::fs::read_to_string(dir.join("hvstats.alerts.yml")).unwrap());
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    let tests = std::fs::read_to_string(dir.join("hvstats.test.yml")).unwrap();
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for alert in &alerts {
        let fires = lines.windows(3).any(|w| {
            w[0] == format!("- alertname: {alert}") && w[1].starts_with("eval_time:") && w[2] == "exp_alerts:"
        });
        assert!(fires, "no unit test shows {alert} firing");
    }

    // The tests are real: an alert whose threshold moves fails them.
    let moved = TempDir::new("mixin-moved");
    for file in ["hvstats.rules.yml", "hvstats.test.yml"] {
        std::fs::copy(dir.join(file), moved.path().join(file)).unwrap();
    }
    let alerts = std::fs::read_to_string(dir.join("hvstats.alerts.yml")).unwrap();
    assert!(alerts.contains("vm:hvstats_cpu_wait:ratio1m > 0.1\n"));
    let moved_alerts =
        alerts.replace("vm:hvstats_cpu_wait:ratio1m > 0.1\n", "vm:hvstats_cpu_wait:ratio1m > 0.3\n");
    std::fs::write(moved.path().join("hvstats.alerts.yml"), moved_alerts).unwrap();
    let (ok, said) = promtool(promtool_path, moved.path(), &["test", "rules", "hvstats.test.yml"]);
    assert!(!ok && said.contains("HvstatsVMCPUWaitHigh"), "{said}");
}

/// Every target expression of the dashboard, with its panel's title.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                panel["title"].as_str().unwrap().to_owned(),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

/// Units of Grafana's unit picker the dashboard may use (Grafana's `valueFormats` ids).
const GRAFANA_UNITS: [&str; 5] = ["short", "ops", "s", "percentunit", "none"];

/// Panel types Grafana ships (core panels), as their `type` ids.
const GRAFANA_PANELS: [&str; 6] = ["row", "timeseries", "stat", "table", "heatmap", "state-timeline"];

#[test]
fn the_dashboard_has_what_grafana_reads() {
    let d = dashboard();
    // The dashboard model Grafana imports: a uid (the URL and provisioning key: at most 40
    // characters of [A-Za-z0-9-_]), a title, a schema version Grafana migrates from.
    let uid = d["uid"].as_str().unwrap();
    assert!(uid.len() <= 40 && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    assert!(!d["title"].as_str().unwrap().is_empty());
    assert_eq!(d["schemaVersion"], 39);
    assert!(d["id"].is_null(), "an id is the importing Grafana's own");
    // A data source variable, then query variables that read it, each defined before it is used.
    let vars = d["templating"]["list"].as_array().unwrap();
    assert_eq!(
        (vars[0]["name"].as_str(), vars[0]["type"].as_str()),
        (Some("datasource"), Some("datasource"))
    );
    assert_eq!(vars[0]["query"], "prometheus");
    let mut defined = vec!["__rate_interval".to_owned(), "datasource".to_owned()];
    for v in &vars[1..] {
        assert_eq!(v["type"], "query");
        assert_eq!(v["datasource"]["uid"], "${datasource}");
        let query = v["query"]["query"].as_str().unwrap();
        assert_eq!(v["definition"].as_str(), Some(query));
        assert!(query.starts_with("label_values("), "{query}");
        for used in variables_in(query) {
            assert!(defined.contains(&used), "{} uses ${used} before it is defined", v["name"]);
        }
        defined.push(v["name"].as_str().unwrap().to_owned());
    }
    // Panels: unique ids, known types, a grid position inside the 24 columns without overlap,
    // the variable's data source, a unit from Grafana's list, targets with a refId and an expr
    // that names only defined variables.
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    let mut drill = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate id in {title}");
        let kind = p["type"].as_str().unwrap();
        assert!(GRAFANA_PANELS.contains(&kind), "{title}: panel type {kind}");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(w > 0 && h > 0 && x + w <= 24, "{title}: {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel at ({cx}, {cy})");
            }
        }
        if kind == "row" {
            drill.push(title.to_owned());
            assert!(p["targets"].is_null());
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert_eq!(p["datasource"]["type"], "prometheus", "{title}");
        let unit = p["fieldConfig"]["defaults"]["unit"].as_str().unwrap();
        assert!(GRAFANA_UNITS.contains(&unit), "{title}: unit {unit}");
        assert!(!p["description"].as_str().unwrap().is_empty(), "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{title}: duplicate refId");
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            for used in variables_in(t["expr"].as_str().unwrap()) {
                assert!(defined.contains(&used), "{title} uses ${used}, which is not defined");
            }
            if kind == "heatmap" {
                assert_eq!(t["format"], "heatmap", "{title}");
            }
        }
    }
    // Fleet → host → VM → VP, in that order.
    assert_eq!(drill, ["Fleet", "Host: $instance", "VM: $vm", "VP: $vp"]);
    // Only the recording rules and the exporter's own series: each metric a query names is one
    // of the rules' records, an hvstats series, or Prometheus' `up`.
    let rules = std::fs::read_to_string(packaging("prometheus/hvstats.rules.yml")).unwrap();
    let records: BTreeSet<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- record: ")).collect();
    for (title, expr) in dashboard_queries(&d) {
        for name in metric_names(&expr) {
            let known = records.contains(name.as_str()) || name.starts_with("hvstats_") || name == "up";
            assert!(known, "{title}: {name} is neither a recording rule nor an exporter series");
        }
    }
}

/// The `$name` variables an expression uses.
fn variables_in(expr: &str) -> Vec<String> {
    expr.split('$')
        .skip(1)
        .map(|s| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
        .collect()
}

/// The metric names an expression selects: words with a `:` or an `hvstats_` prefix, or `up`,
/// followed by `{`, `[`, `)` or a space.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut word = String::new();
    let mut in_string = false;
    for c in expr.chars().chain([' ']) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            word.push(c);
            continue;
        }
        if !in_string
            && matches!(c, '{' | '[' | ')' | ' ' | ',')
            && (word.contains(':') || word.starts_with("hvstats_") || word == "up")
        {
            names.push(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

/// Every exporter series the rules, the alerts and the dashboard name: words of their text that
/// begin with `hvstats_` (a recording rule's name has colons, and is no such word).
fn mixin_series() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for file in ["prometheus/hvstats.rules.yml", "prometheus/hvstats.alerts.yml", "grafana/hvstats.json"] {
        let text = std::fs::read_to_string(packaging(file)).unwrap();
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            if word.starts_with("hvstats_") && !word.contains(':') {
                out.entry(word.to_owned()).or_insert_with(|| file.to_owned());
            }
        }
    }
    out
}

#[test]
fn every_series_the_mixin_reads_comes_from_a_default_collector() {
    use hvstats_present::collectors::{Collector, Selection, collectors_of_series};
    let series = mixin_series();
    assert!(series.len() >= 15, "{series:?}");
    let defaults = Selection::defaults();
    for (name, file) in &series {
        let collectors = collectors_of_series(name);
        assert!(!collectors.is_empty(), "{file} reads {name}, which no collector exports");
        if name.ends_with("_bucket") {
            // Classic buckets are the histograms collectors' (native histograms need none).
            assert!(
                file.ends_with(".json"),
                "{file}: a rule or alert on {name} needs a non-default collector"
            );
            assert!(collectors.contains(&Collector::Histograms), "{name}: {collectors:?}");
            continue;
        }
        assert!(
            collectors.iter().any(|c| defaults.has(*c)),
            "{file} reads {name}, exported by {collectors:?}, none of them on by default"
        );
    }
}

/// `hvstats serve` over `dir` on a free loopback port./// `hvstats serve` over `dir` on a free loopback port.
fn serve(dir: &Path, flags: &[&str]) -> (KilledOnDrop, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(dir)
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::serving_addr(&mut child);
    (KilledOnDrop(child), addr)
}

/// Prometheus' answer to `path` (an API call): its `data`, or the error it said.
fn api(prometheus: SocketAddr, path: &str) -> Result<Value, String> {
    if std::net::TcpStream::connect(prometheus).is_err() {
        return Err("not listening yet".into());
    }
    let reply = http_get(prometheus, path);
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {reply}"))?;
    if v["status"] != "success" {
        return Err(format!("{path}: {v}"));
    }
    Ok(v["data"].clone())
}

/// The values of the dashboard variable query `label_values(selector, label)`.
fn label_values(prometheus: SocketAddr, query: &str) -> Result<Vec<String>, String> {
    let inner = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).unwrap();
    let (selector, label) = inner.rsplit_once(',').unwrap();
    let data =
        api(prometheus, &format!("/api/v1/label/{}/values?match[]={}", label.trim(), url_encoded(selector)))?;
    Ok(data.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect())
}

/// `expr` with the dashboard's variables replaced by `values` (a regex of the chosen values).
fn substituted(expr: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = expr.replace("$__rate_interval", "1m");
    for (name, value) in values {
        out = out.replace(&format!("${name}"), value);
    }
    out
}

/// Waits for `ready` to say yes about Prometheus, up to a deadline; the last answer otherwise.
fn until<T>(what: &str, deadline: Instant, mut ready: impl FnMut() -> Result<T, String>) -> T {
    loop {
        match ready() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!("{what}: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A QEMU VM (SeaBIOS, then idle) named `obs-vm` with a QMP socket, and `hvstats observe`
/// publishing it under `dir`; `None` without KVM or QEMU (skipped, unless required).
fn observed_qemu(dir: &Path, work: &Path) -> Option<(KilledOnDrop, KilledOnDrop)> {
    let qmp = work.join("qmp.sock");
    let qemu = KilledOnDrop(spawn_qemu(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "16", "-name", "guest=obs-vm"])
            .args(["-uuid", "0f3c2a52-6a0e-4d0e-9a83-0c1d2e3f4a5b", "-qmp"])
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "observed_qemu",
    )?);
    wait_for_kvm_vcpus(qemu.0.id() as i32, 1, Duration::from_secs(30));
    let observer = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--pid", &qemu.0.id().to_string(), "--runtime-dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Some((qemu, KilledOnDrop(observer)))
}

/// Synthetic traffic published under `dir` by a thread of this process until the guard drops.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, flag) = (dir.to_owned(), stop.clone());
        let thread = std::thread::spawn(move || hvstats_testkit::synthetic_load(&dir, 600.0, &flag).unwrap());
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn prometheus_with_the_rules_answers_every_dashboard_query_over_two_hosts() {
    let test = "prometheus_with_the_rules_answers_every_dashboard_query_over_two_hosts";
    let Some(prometheus) = prometheus_tool("prometheus", test) else { return };
    // Two hosts: A runs the synthetic load; B too, and where there is KVM a partition of
    // `hvstats run` and a QEMU VM `hvstats observe` publishes.
    let (host_a, host_b, work) =
        (TempDir::new("mixin-a"), TempDir::new("mixin-b"), TempDir::new("mixin-work"));
    let _load_a = Load::start(host_a.path());
    let _load_b = Load::start(host_b.path());
    let kvm = common::kvm_available(test);
    let run = kvm.then(|| {
        KilledOnDrop(
            Command::new(env!("CARGO_BIN_EXE_hvstats"))
                .args(["run", "--name", "runvm", "--vps", "1", "--forever", "--runtime-dir"])
                .arg(host_b.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    });
    let observed = if kvm { observed_qemu(host_b.path(), work.path()) } else { None };
    // Both hosts on the default collectors; host B's histograms from a second exporter with the
    // histograms collector on (the dashboard's heatmaps read classic buckets).
    let (_serve_a, addr_a) = serve(host_a.path(), &[]);
    let (_serve_b, addr_b) = serve(host_b.path(), &[]);
    let (_serve_h, addr_h) = serve(host_b.path(), &["--collector.histograms"]);

    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n  - {}\n\
         scrape_configs:\n  - job_name: hvstats\n    static_configs:\n      - targets: ['{addr_a}', '{addr_b}', '{addr_h}']\n",
        packaging("prometheus/hvstats.rules.yml").display(),
        packaging("prometheus/hvstats.alerts.yml").display(),
    );
    let (_prometheus, web) = start_prometheus(prometheus, &config, work.path());
    let deadline = Instant::now() + Duration::from_secs(180);

    // Every rule loaded and evaluated without an error.
    until("every rule evaluates", deadline, || {
        let data = api(web, "/api/v1/rules")?;
        let rules: Vec<&Value> =
            data["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
        let bad: Vec<String> = rules
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{} {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        if rules.len() == 29 && bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{} rules, not ok: {bad:?}", rules.len()))
        }
    });

    // The variables, as Grafana would list them: both hosts, then host B's VMs and their VPs.
    let d = dashboard();
    let mut chosen = BTreeMap::new();
    for v in &d["templating"]["list"].as_array().unwrap()[1..] {
        let name = v["name"].as_str().unwrap().to_owned();
        let query = substituted(v["query"]["query"].as_str().unwrap(), &chosen);
        let mut vms = vec!["db-1", "web-1"];
        if run.is_some() {
            vms.push("runvm");
        }
        if observed.is_some() {
            vms.push("obs-vm");
        }
        let pick = until(&format!("${name} lists what it should"), deadline, || {
            let values = label_values(web, &query)?;
            let has = |wanted: &[String]| wanted.iter().all(|w| values.contains(w));
            let ok = match name.as_str() {
                "job" => values == ["hvstats"],
                "instance" => has(&[addr_a.to_string(), addr_b.to_string()]),
                "vm" => has(&vms.iter().map(|v| v.to_string()).collect::<Vec<_>>()),
                _ => !values.is_empty(),
            };
            match (ok, name.as_str()) {
                (false, _) => Err(format!("{query}: {values:?}")),
                // The drill-down goes to host B, the one with every kind of VM.
                (true, "instance") => Ok(addr_b.to_string()),
                (true, _) => Ok(values.join("|")),
            }
        });
        chosen.insert(name, pick);
    }

    // With an observed VM, host B exports every series of an observer (its QMP socket, found on
    // QEMU's command line, gives the VM's state and its source); without, those are left out.
    let pending: Vec<&str> = match observed {
        Some(_) => {
            until("host B exports the observer's series", deadline, || {
                let text = http_get(addr_b, "/metrics");
                let missing: Vec<&str> =
                    OBSERVER_SERIES.iter().copied().filter(|s| !text.contains(&format!("\n{s}{{"))).collect();
                if missing.is_empty() { Ok(()) } else { Err(format!("missing {missing:?}")) }
            });
            Vec::new()
        }
        None => OBSERVER_SERIES.to_vec(),
    };

    // Every query of every panel returns series: none is empty, none is an error.
    let mut checked = 0;
    let mut left_out = Vec::new();
    for (title, expr) in dashboard_queries(&d) {
        if let Some(p) = pending.iter().find(|p| metric_names(&expr).iter().any(|n| n == *p)) {
            left_out.push(format!("{title} ({p})"));
            continue;
        }
        let mut values = chosen.clone();
        if metric_names(&expr).iter().any(|n| n.ends_with("_bucket")) {
            values.insert("instance".to_owned(), addr_h.to_string());
        }
        let query = substituted(&expr, &values);
        let result = until(&format!("panel {title:?}: {query}"), deadline, || {
            let data = api(web, &format!("/api/v1/query?query={}", url_encoded(&query)))?;
            match data["result"].as_array() {
                Some(r) if !r.is_empty() => Ok(r.clone()),
                _ => Err("no series".into()),
            }
        });
        assert!(!result.is_empty());
        checked += 1;
    }
    eprintln!("{checked} dashboard queries return series; left out until serve exports them: {left_out:?}");
    assert!(checked > 2 * left_out.len(), "{checked} checked, {left_out:?} left out");

    // The numbers are the hosts': both hosts' VMs exit, and with KVM the partition `run` runs
    // counts real exits of its own.
    let exits = |vm: &str, host: SocketAddr| {
        let q = format!("vm:hvstats_exits:rate1m{{instance=\"{host}\",vm=\"{vm}\"}}");
        until(&q, deadline, || {
            let data = api(web, &format!("/api/v1/query?query={}", url_encoded(&q)))?;
            let v = data["result"][0]["value"][1].as_str().and_then(|v| v.parse::<f64>().ok());
            v.filter(|v| *v > 0.0).ok_or_else(|| format!("{data}"))
        })
    };
    for host in [addr_a, addr_b] {
        // db-1's 4 VPs exit about 5 × 2.85 × 100 times a second (see synthetic_load).
        assert!(exits("db-1", host) > exits("web-1", host), "db-1 exits more than web-1");
    }
    if run.is_some() {
        exits("runvm", addr_b);
    }
}
