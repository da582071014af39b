//! The monitoring mixin (packaging/prometheus, packaging/grafana) against Debian's Prometheus:
//! promtool checks the rules and runs their unit tests (a firing case and a false-alarm case per
//! alert), the CPU-wait rule reads the share `hvstats report` prints, the dashboard has what
//! Grafana reads, and a real Prometheus scraping two real `hvstats serve`s with the rules loaded
//! answers every query of the dashboard with series, and every one for an observed QEMU VM.

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

use common::{
    KilledOnDrop, TempDir, http_get, prometheus_tool, serve, start_prometheus, start_prometheus_agent,
    start_prometheus_with, url_encoded,
};
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

/// A file of packaging/prometheus as YAML.
fn yaml(file: &str) -> Value {
    serde_norway::from_str(&std::fs::read_to_string(packaging("prometheus").join(file)).unwrap()).unwrap()
}

/// A Prometheus duration (`90s`, `10m`, `1h`) in seconds.
fn seconds(duration: &str) -> u64 {
    let split = duration.find(|c: char| !c.is_ascii_digit()).unwrap();
    let (n, unit) = duration.split_at(split);
    n.parse::<u64>().unwrap()
        * match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            other => panic!("unit {other}"),
        }
}

/// Every alert of hvstats.alerts.yml with its `for`, in seconds.
fn alerts() -> Vec<(String, u64)> {
    yaml("hvstats.alerts.yml")["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| (r["alert"].as_str().unwrap().to_owned(), seconds(r["for"].as_str().unwrap())))
        .collect()
}

/// `promtool test rules hvstats.test.yml` over packaging/prometheus with `alerts` in place of
/// hvstats.alerts.yml: (success, what it said).
fn test_with_alerts(promtool_path: &str, alerts: &str) -> (bool, String) {
    let dir = packaging("prometheus");
    let copy = TempDir::new("mixin-moved");
    for file in ["hvstats.rules.yml", "hvstats.test.yml"] {
        std::fs::copy(dir.join(file), copy.path().join(file)).unwrap();
    }
    std::fs::write(copy.path().join("hvstats.alerts.yml"), alerts).unwrap();
    promtool(promtool_path, copy.path(), &["test", "rules", "hvstats.test.yml"])
}

#[test]
fn promtool_checks_the_rules_and_every_alert_has_a_firing_and_a_false_alarm_unit_test() {
    let Some(promtool_path) = prometheus_tool("promtool", "promtool_checks_the_rules") else { return };
    let dir = packaging("prometheus");
    let (ok, said) =
        promtool(promtool_path, &dir, &["check", "rules", "hvstats.rules.yml", "hvstats.alerts.yml"]);
    assert!(ok, "{said}");
    assert!(said.contains("SUCCESS: 22 rules found") && said.contains("SUCCESS: 12 rules found"), "{said}");
    let (ok, said) = promtool(promtool_path, &dir, &["test", "rules", "hvstats.test.yml"]);
    assert!(ok && said.contains("SUCCESS"), "{said}");

    // The files' headers name files that exist beside them.
    for file in ["hvstats.rules.yml", "hvstats.alerts.yml", "hvstats.test.yml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for named in text.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == '`' || c == ',') {
            let named = named.trim_end_matches(['.', ':', ';']);
            if named.starts_with("hvstats.") && named.ends_with(".yml") {
                assert!(dir.join(named).exists(), "{file} names {named}, which does not exist");
            }
        }
    }

    // Each alert has a case in which it fires (an alert_rule_test with exp_alerts), and a case
    // with the false alarm it must not raise: an alert_rule_test that expects nothing at a time
    // later than its `for` and a minute (the series had time to fire it, and must not have).
    let alerts = alerts();
    assert_eq!(alerts.len(), 12, "{alerts:?}");
    let tests = yaml("hvstats.test.yml");
    let cases: Vec<(String, u64, bool)> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .map(|c| {
            let fires = c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            (c["alertname"].as_str().unwrap().to_owned(), seconds(c["eval_time"].as_str().unwrap()), fires)
        })
        .collect();
    for (alert, hold) in &alerts {
        assert!(cases.iter().any(|(a, _, fires)| a == alert && *fires), "no unit test shows {alert} firing");
        assert!(
            cases.iter().any(|(a, at, fires)| a == alert && !fires && *at > hold + 60),
            "no unit test shows {alert} quiet on a false alarm past its `for` of {hold} s"
        );
    }
    eprintln!("{} alert cases for {} alerts", cases.len(), alerts.len());

    // The tests are real: an alert whose threshold moves fails its firing case; one without its
    // activity floor fires on the idle VMs, and one without its grace period on a restart.
    let text = std::fs::read_to_string(dir.join("hvstats.alerts.yml")).unwrap();
    let mutate = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        test_with_alerts(promtool_path, &text.replace(from, to))
    };
    let (ok, said) = mutate("vm:hvstats_cpu_wait:ratio1m > 0.1\n", "vm:hvstats_cpu_wait:ratio1m > 0.3\n");
    assert!(!ok && said.contains("HvstatsVMCPUWaitHigh"), "{said}");
    let (ok, said) = mutate(
        "\n            and on (cluster, job, instance, vm) vm:hvstats_runnable_seconds:rate1m >= 0.1",
        "",
    );
    assert!(!ok && said.contains("vm=\"idle-1\"") && said.contains("vm=\"idle-2\""), "{said}");
    let (ok, said) =
        mutate("hvstats_observer_up'\n        for: '10m'", "hvstats_observer_up'\n        for: '1m'");
    assert!(!ok && said.contains("instance=\"host-c:9966\""), "{said}");
}

/// Records a VP that waits 20 µs for a host CPU for each 140 µs it runs, and returns what `hvstats
/// report` says of its CPU wait: (its JSON `cpu_wait`, its text line).
fn report_of_a_waiting_vp(tmp: &Path) -> (Value, String) {
    let run = tmp.join("run");
    let hv = common::publish(&run);
    let part = hv.create_partition(1).unwrap();
    let page = part.vp_page(0).unwrap();
    let file = tmp.join("rec.ndjson");
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["record", "-q", "--interval", "0.2", "--duration", "1.2", "--runtime-dir"])
        .arg(&run)
        .arg("-o")
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&file).map_or(0, |t| t.lines().count()) < 2 {
        assert!(Instant::now() < deadline, "no first sample");
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(250));
        page.add(hvstats_abi::catalog::vp::DISPATCHES, 10);
        page.add(hvstats_abi::catalog::vp::CPU_WAIT_TIME_PER_DISPATCH, 20_000);
        page.add(hvstats_abi::catalog::vp::TOTAL_RUN_TIME, 1_400);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvstats"));
        cmd.arg("report");
        if json {
            cmd.arg("--json");
        }
        let out = cmd.arg(&file).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let v: Value = serde_json::from_str(&report(true)).unwrap();
    let text = report(false);
    let line = text.lines().find(|l| l.trim_start().starts_with("CPU wait:")).unwrap().to_owned();
    drop((part, hv));
    (v["vps"][0]["cpu_wait"].clone(), line)
}

/// The CPU-wait rule and alert (packaging/prometheus/hvstats.rules.yml vm:hvstats_cpu_wait:ratio1m,
/// hvstats.alerts.yml HvstatsVMCPUWaitHigh) and `hvstats report` (crates/hvstats-cli/src/cmd/
/// report.rs, its "% of runnable time") give one share for the same counters: the CPU wait over
/// the runnable time (run + wait). The idle-VM case of hvstats.test.yml uses the same ratio.
#[test]
fn report_and_the_cpu_wait_rule_say_one_share() {
    let Some(promtool_path) = prometheus_tool("promtool", "report_and_the_cpu_wait_rule_say_one_share")
    else {
        return;
    };
    let tmp = TempDir::new("mixin-share");
    let (wait, line) = report_of_a_waiting_vp(tmp.path());
    let (wait_ns, run_ns) = (wait["wait_ns"].as_u64().unwrap(), wait["run_ns"].as_u64().unwrap());
    assert_eq!((wait_ns, run_ns), (60_000, 420_000), "{wait}");
    let share = wait["percent_of_runnable"].as_f64().unwrap();
    assert_eq!(share, 12.5);
    assert!(line.contains("12.50 % of runnable time (run + wait)"), "{line}");

    // The same counters as the exporter's series, scaled to one host CPU a second (busy) and to
    // 7.3 ms a second (idle, below the alert's activity floor): the rule reads the report's share,
    // and the alert says it of the busy VM only.
    let per_15s = |part: u64, cpus: f64| 15.0 * cpus * part as f64 / (wait_ns + run_ns) as f64;
    let series = |vm: &str, cpus: f64| {
        format!(
            "      - series: 'hvstats_vp_cpu_wait_seconds_total{{job=\"hvstats\",instance=\"h:9966\",vm=\"{vm}\",vp=\"0\"}}'\n        values: '0+{}x80'\n\
             \x20     - series: 'hvstats_vp_total_run_seconds_total{{job=\"hvstats\",instance=\"h:9966\",vm=\"{vm}\",vp=\"0\"}}'\n        values: '0+{}x80'\n",
            per_15s(wait_ns, cpus),
            per_15s(run_ns, cpus)
        )
    };
    let humanized = format!("{share:.4}").trim_end_matches('0').trim_end_matches('.').to_owned();
    let test = format!(
        "rule_files: [hvstats.rules.yml, hvstats.alerts.yml]\nevaluation_interval: 15s\ntests:\n\
         \x20 - interval: 15s\n    input_series:\n{}{}    promql_expr_test:\n\
         \x20     - expr: vm:hvstats_cpu_wait:ratio1m{{vm=\"busy\"}}\n        eval_time: 5m\n        exp_samples:\n\
         \x20         - labels: 'vm:hvstats_cpu_wait:ratio1m{{job=\"hvstats\",instance=\"h:9966\",vm=\"busy\"}}'\n\
         \x20           value: {}\n\
         \x20   alert_rule_test:\n      - alertname: HvstatsVMCPUWaitHigh\n        eval_time: 15m\n        exp_alerts:\n\
         \x20         - exp_labels: {{severity: warning, job: hvstats, instance: 'h:9966', vm: busy}}\n\
         \x20           exp_annotations:\n\
         \x20             summary: \"VM busy on h:9966 waits for a CPU {humanized}% of its runnable time\"\n\
         \x20             description: \"{}\"\n",
        series("busy", 1.0),
        series("idle", 0.0073),
        share / 100.0,
        alert_description("busy"),
    );
    let dir = tmp.path().join("rules");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["hvstats.rules.yml", "hvstats.alerts.yml"] {
        std::fs::copy(packaging("prometheus").join(file), dir.join(file)).unwrap();
    }
    std::fs::write(dir.join("share.test.yml"), &test).unwrap();
    let (ok, said) = promtool(promtool_path, &dir, &["test", "rules", "share.test.yml"]);
    assert!(ok, "{said}\n{test}");
}

/// HvstatsVMCPUWaitHigh's description for `vm`, from hvstats.alerts.yml.
fn alert_description(vm: &str) -> String {
    let rules = yaml("hvstats.alerts.yml");
    let rule = rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "HvstatsVMCPUWaitHigh")
        .unwrap()
        .clone();
    rule["annotations"]["description"].as_str().unwrap().replace("{{ $labels.vm }}", vm)
}

/// Every target expression of the dashboard, with its panel's title.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    dashboard_targets(dashboard).into_iter().map(|(title, _, expr)| (title, expr)).collect()
}

/// Every target expression of the dashboard, with its panel's title and type.
fn dashboard_targets(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                panel["title"].as_str().unwrap().to_owned(),
                panel["type"].as_str().unwrap().to_owned(),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

/// How a heatmap's query reads its histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Histograms {
    /// Classic buckets: `_bucket` series and their `le` label (the text formats).
    Classic,
    /// Native histograms: the family's own name (protobuf, Prometheus' native histograms).
    Native,
}

/// Which histograms a query of a panel of type `kind` reads; `None` for a query of no histogram.
fn histogram_mode(kind: &str, expr: &str) -> Option<Histograms> {
    match (kind, expr.contains("_bucket") && expr.contains("le")) {
        (_, true) => Some(Histograms::Classic),
        ("heatmap", false) => Some(Histograms::Native),
        _ => None,
    }
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
    // Fleet → host → VM → VP, in that order, then the histograms, whose row says what serve
    // needs to export them.
    assert_eq!(drill[..4], ["Fleet", "Host: $instance", "VM: $vm", "VP: $vp"]);
    assert_eq!(drill.len(), 5, "{drill:?}");
    assert!(drill[4].starts_with("Histograms") && drill[4].contains("--collector.histograms"), "{drill:?}");
    // Every heatmap is in that row (below its header), and reads a histogram observed VMs have:
    // KVM's halt histograms.
    let histograms_at =
        panels.iter().find(|p| p["title"] == drill[4].as_str()).unwrap()["gridPos"]["y"].as_u64();
    // Each has a query of classic buckets and one of the same native histogram.
    for p in panels.iter().filter(|p| p["type"] == "heatmap") {
        assert!(p["gridPos"]["y"].as_u64() > histograms_at, "{} above the histograms row", p["title"]);
        let exprs: Vec<&str> =
            p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap()).collect();
        let [classic, native] = exprs[..] else { panic!("{}: {exprs:?}", p["title"]) };
        assert!(classic.contains("hvstats_vp_halt_"), "{}: {classic}", p["title"]);
        assert_eq!(histogram_mode("heatmap", classic), Some(Histograms::Classic), "{classic}");
        assert_eq!(histogram_mode("heatmap", native), Some(Histograms::Native), "{native}");
        assert_eq!(classic.replace("sum by (le) (", "sum(").replace("_bucket{", "{"), native);
    }
    // Stat panels have thresholds; where an alert watches the same number, its threshold is the
    // panel's red step.
    for p in panels.iter().filter(|p| p["type"] == "stat") {
        let steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"].as_array();
        assert!(
            steps.is_some_and(|s| !s.is_empty() && s[0]["value"].is_null()),
            "{}: no thresholds",
            p["title"]
        );
        assert_eq!(p["fieldConfig"]["defaults"]["color"]["mode"], "thresholds", "{}", p["title"]);
    }
    let red = |title: &str| {
        let p = panels.iter().find(|p| p["title"] == title).unwrap();
        let steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"].as_array().unwrap();
        steps.iter().find(|s| s["color"] == "red").unwrap()["value"].as_f64().unwrap()
    };
    assert_eq!(red("CPU wait"), 0.1, "HvstatsVMCPUWaitHigh's threshold");
    assert_eq!(red("Observer refresh age"), 60.0, "HvstatsObserverStale's threshold");
    // The classes are not parts of the exits on every host (under KVM's instruction emulator an
    // I/O instruction KVM handles in the kernel is no exit): no panel stacks them, each panel of
    // classes draws all the exits beside them, and says on which hosts the classes are parts.
    let rules = yaml("hvstats.rules.yml");
    let rules: Vec<&Value> =
        rules["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    let rule = |record: &str| rules.iter().find(|r| r["record"] == record).unwrap()["expr"].as_str().unwrap();
    assert_eq!(
        rule("vm_intercept:hvstats_intercepts:rate1m"),
        "sum by (cluster, job, instance, vm, intercept) (rate(hvstats_vp_intercepts_total{intercept!=\"emulated\"}[1m]))"
    );
    let mut class_panels = 0;
    for p in panels.iter().filter(|p| p["type"] == "timeseries") {
        let targets = p["targets"].as_array().unwrap();
        let exprs: Vec<&str> = targets.iter().map(|t| t["expr"].as_str().unwrap()).collect();
        if !exprs.iter().any(|e| e.contains("intercepts")) {
            continue;
        }
        class_panels += 1;
        let title = p["title"].as_str().unwrap();
        assert_ne!(
            p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"], "normal",
            "{title} stacks classes"
        );
        assert!(exprs.iter().any(|e| e.contains("exits")), "{title}: no line of all the exits");
        let said = p["description"].as_str().unwrap();
        assert!(said.contains("VMX/SVM") && said.contains("instruction emulator"), "{title}: {said}");
    }
    assert_eq!(class_panels, 3, "the host's, the VM's and the VP's classes");
    let emulated: Vec<&Value> = panels
        .iter()
        .filter(|p| p["targets"][0]["expr"].as_str().is_some_and(|e| e.contains("emulated_instructions")))
        .collect();
    assert_eq!(emulated.len(), 2, "the host's and the VM's emulated instructions");
    // HLT is time halted, per vCPU, nowhere a handling time.
    let halted = panels.iter().find(|p| p["title"] == "Time halted per vCPU").unwrap();
    assert_eq!(halted["fieldConfig"]["defaults"]["unit"], "percentunit");
    assert!(halted["targets"][0]["expr"].as_str().unwrap().starts_with("vp:hvstats_halted:ratio1m"));
    assert!(
        rule("vm_intercept:hvstats_intercept_seconds:rate1m")
            .contains("rate(hvstats_vp_intercept_seconds_total{intercept!=\"hlt\"}[1m])")
    );
    // Only the recording rules and the exporter's own series: each metric a query names is one
    // of the rules' records, an hvstats series, or Prometheus' `up`.
    let records: BTreeSet<&str> = rules.iter().filter_map(|r| r["record"].as_str()).collect();
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
        if collectors.contains(&Collector::Histograms) {
            // Histograms, classic buckets or native, are the histograms collectors' (only the
            // dashboard's heatmaps read them).
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

/// Waits for `ready` to say yes, up to `deadline`; its last answer otherwise.
fn until_or_last(deadline: Instant, mut ready: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    loop {
        match ready() {
            Ok(()) => return Ok(()),
            Err(last) if Instant::now() > deadline => return Err(last),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A QEMU VM of two vCPUs (SeaBIOS on one, then idle; the other halted throughout) named `obs-vm`
/// with a QMP socket, and `hvstats observe` publishing it under `dir`; `None` without KVM or QEMU
/// (skipped, unless required).
fn observed_qemu(dir: &Path, work: &Path) -> Option<(KilledOnDrop, KilledOnDrop)> {
    common::observed_qemu(dir, work, ("obs-vm", "0f3c2a52-6a0e-4d0e-9a83-0c1d2e3f4a5b", 2), "observed_qemu")
}

/// Each heatmap of the dashboard, asked of the Prometheus at `web` with `values` for its
/// variables: its query of `mode` returns series (within the deadline), and its other query none.
fn heatmaps_have_data(
    web: SocketAddr,
    d: &Value,
    values: &BTreeMap<String, String>,
    mode: Histograms,
    deadline: Instant,
) {
    let series = |query: &str| -> Result<usize, String> {
        let data = api(web, &format!("/api/v1/query?query={}", url_encoded(query)))?;
        Ok(data["result"].as_array().map_or(0, Vec::len))
    };
    let mut heatmaps = 0;
    for (title, kind, expr) in dashboard_targets(d) {
        let Some(reads) = histogram_mode(&kind, &expr) else { continue };
        let query = substituted(&expr, values);
        if reads == mode {
            until(&format!("{mode:?} heatmap {title:?}: {query}"), deadline, || match series(&query)? {
                0 => Err("no series".to_owned()),
                _ => Ok(()),
            });
            heatmaps += 1;
        }
    }
    // Asked once every heatmap of `mode` has data: the other kind's queries have none.
    for (title, kind, expr) in dashboard_targets(d) {
        if histogram_mode(&kind, &expr).is_some_and(|reads| reads != mode) {
            let query = substituted(&expr, values);
            assert_eq!(series(&query), Ok(0), "{mode:?} Prometheus, heatmap {title:?}: {query}");
        }
    }
    assert_eq!(heatmaps, 3, "{mode:?}: the three halt heatmaps");
    eprintln!("every heatmap has data with {mode:?} histograms");
}

/// Every rule of the mixin loaded by the Prometheus at `web` and evaluated without an error.
fn every_rule_evaluates(web: SocketAddr, deadline: Instant) {
    until("every rule evaluates", deadline, || {
        let data = api(web, "/api/v1/rules")?;
        let rules: Vec<&Value> =
            data["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
        let bad: Vec<String> = rules
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{} {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        if rules.len() == 34 && bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{} rules, not ok: {bad:?}", rules.len()))
        }
    });
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
    // A second Prometheus, with native histograms on, scrapes the histograms exporter: it asks
    // for protobuf and ingests each histogram as a native one, without classic buckets.
    let native_work = TempDir::new("mixin-native");
    let native_config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hvstats\n    static_configs:\n      - targets: ['{addr_h}']\n"
    );
    let (_native, native_web) = start_prometheus_with(
        prometheus,
        &native_config,
        native_work.path(),
        &["--enable-feature=native-histograms"],
    );
    let deadline = Instant::now() + Duration::from_secs(180);

    every_rule_evaluates(web, deadline);

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
                // One Prometheus, no external labels: no cluster; All (`.*`) matches its series.
                "cluster" => values.is_empty(),
                "job" => values == ["hvstats"],
                "instance" => has(&[addr_a.to_string(), addr_b.to_string()]),
                "vm" => has(&vms.iter().map(|v| v.to_string()).collect::<Vec<_>>()),
                _ => !values.is_empty(),
            };
            match (ok, name.as_str()) {
                (false, _) => Err(format!("{query}: {values:?}")),
                (true, "cluster") => Ok(".*".to_owned()),
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
    for (title, kind, expr) in dashboard_targets(&d) {
        if histogram_mode(&kind, &expr) == Some(Histograms::Native) {
            continue; // the heatmaps are checked in each mode below
        }
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

    // Drilled down to the observed QEMU VM alone (its host, the VM, each of its VPs), every
    // panel has data: nothing is empty for a VM hvstats observes, the halt histograms' heatmaps
    // included (from the exporter with `--collector.histograms`, as the row's title says).
    if observed.is_some() {
        let mut obs = chosen.clone();
        obs.insert("vm".into(), "obs-vm".into());
        let vps = until("obs-vm's VPs", deadline, || {
            let q = "label_values(hvstats_vp_total_run_seconds_total{vm=\"obs-vm\"}, vp)";
            let values = label_values(web, q)?;
            if values.len() == 2 { Ok(values.join("|")) } else { Err(format!("{values:?}")) }
        });
        obs.insert("vp".into(), vps);
        let mut empty = Vec::new();
        let observed_deadline = Instant::now() + Duration::from_secs(120);
        for (title, kind, expr) in dashboard_targets(&d) {
            if histogram_mode(&kind, &expr) == Some(Histograms::Native) {
                continue;
            }
            let mut values = obs.clone();
            if metric_names(&expr).iter().any(|n| n.ends_with("_bucket")) {
                values.insert("instance".to_owned(), addr_h.to_string());
            }
            let query = substituted(&expr, &values);
            let got = until_or_last(observed_deadline, || {
                let data = api(web, &format!("/api/v1/query?query={}", url_encoded(&query)))?;
                let r = data["result"].as_array().cloned().unwrap_or_default();
                // A query of the VM's rows gives the observed VM's series, not another's.
                let others = r.iter().any(|s| s["metric"]["vm"].as_str().is_some_and(|v| v != "obs-vm"));
                match (r.is_empty(), others && expr.contains("$vm")) {
                    (false, false) => Ok(()),
                    (true, _) => Err("no series".to_owned()),
                    (false, true) => Err(format!("series of other VMs: {r:?}")),
                }
            });
            if let Err(why) = got {
                empty.push(format!("{title}: {query}: {why}"));
            }
        }
        assert!(empty.is_empty(), "panels without data for the observed VM: {empty:#?}");
        eprintln!(
            "every one of the {} dashboard queries of classic series returns obs-vm's series",
            dashboard_queries(&d).len()
        );
    }

    // Every heatmap has data with classic buckets (this Prometheus) and with native histograms
    // (the second, which scrapes the histograms exporter over protobuf): in each, the query of
    // the other kind is empty. Drilled down to the observed VM where there is one.
    let mut heatmap_values = chosen.clone();
    heatmap_values.insert("instance".to_owned(), addr_h.to_string());
    if observed.is_some() {
        heatmap_values.insert("vm".into(), "obs-vm".into());
    }
    heatmaps_have_data(web, &d, &heatmap_values, Histograms::Classic, deadline);
    heatmaps_have_data(native_web, &d, &heatmap_values, Histograms::Native, deadline);

    // Every HLT of the observed VM is one of its exits, on this host too (KVM's exits count its
    // halts); its I/O class is what the classes panels leave unstacked for (printed).
    if observed.is_some() {
        let value = |q: &str| {
            let data = api(web, &format!("/api/v1/query?query={}", url_encoded(q))).unwrap();
            data["result"][0]["value"][1].as_str().and_then(|v| v.parse::<f64>().ok())
        };
        let vm = "{vm=\"obs-vm\"}";
        let (exits, hlt, io) = until("obs-vm's exits and halts", deadline, || {
            let classes = |class: &str| {
                value(&format!(
                    "vm_intercept:hvstats_intercepts:rate1m{{vm=\"obs-vm\",intercept=\"{class}\"}}"
                ))
            };
            match (value(&format!("vm:hvstats_exits:rate1m{vm}")), classes("hlt"), classes("io")) {
                (Some(e), Some(h), Some(i)) if e > 0.0 => Ok((e, h, i)),
                other => Err(format!("{other:?}")),
            }
        });
        eprintln!("obs-vm per second: {exits:.2} exits, {hlt:.2} HLT, {io:.2} I/O");
        assert!(hlt <= exits, "{hlt} HLT a second, more than the {exits} exits");
    }

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

/// The files packaging/mixin generates, by path under packaging/.
const MIXIN_FILES: [&str; 3] =
    ["prometheus/hvstats.rules.yml", "prometheus/hvstats.alerts.yml", "grafana/hvstats.json"];

/// `jsonnet` (Debian's package jsonnet), or `None`: skipped, unless `HVSTATS_REQUIRE_JSONNET=1`
/// (CI installs it), where it fails.
fn jsonnet(test: &str) -> Option<&'static str> {
    let path = "/usr/bin/jsonnet";
    if Path::new(path).exists() {
        return Some(path);
    }
    let msg = format!("{test}: {path} is missing (Debian package jsonnet)");
    assert!(std::env::var("HVSTATS_REQUIRE_JSONNET").as_deref() != Ok("1"), "{msg}");
    eprintln!("{msg}: skipped");
    None
}

/// The mixin rendered by packaging/mixin/build.sh into `out`, `config` overriding its _config.
fn render_mixin(out: &Path, config: &str) {
    let done = Command::new(packaging("mixin/build.sh")).arg(out).arg(config).output().unwrap();
    assert!(done.status.success(), "build.sh: {}", String::from_utf8_lossy(&done.stderr));
}

#[test]
fn the_shipped_rules_alerts_and_dashboard_are_what_the_mixin_generates() {
    if jsonnet("the_shipped_rules_alerts_and_dashboard_are_what_the_mixin_generates").is_none() {
        return;
    }
    let out = TempDir::new("mixin-render");
    render_mixin(out.path(), "{}");
    for file in MIXIN_FILES {
        let (made, shipped) = (
            std::fs::read_to_string(out.path().join(file)).unwrap(),
            std::fs::read_to_string(packaging(file)).unwrap(),
        );
        let first = made.lines().zip(shipped.lines()).position(|(m, s)| m != s);
        assert!(
            made == shipped,
            "packaging/{file} is not what packaging/mixin generates (line {:?}): run packaging/mixin/build.sh",
            first.map(|l| l + 1)
        );
    }

    // The configuration is what they come from: another cluster label is kept by every rule that
    // aggregates and matched by every join and every dashboard query, and the cluster variable
    // shows where showMultiCluster says so.
    let other = TempDir::new("mixin-region");
    render_mixin(other.path(), "{clusterLabel: 'region', showMultiCluster: true}");
    let exprs: Vec<String> = ["prometheus/hvstats.rules.yml", "prometheus/hvstats.alerts.yml"]
        .iter()
        .flat_map(|f| {
            let y: Value =
                serde_norway::from_str(&std::fs::read_to_string(other.path().join(f)).unwrap()).unwrap();
            y["groups"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|g| g["rules"].as_array().unwrap().clone())
                .collect::<Vec<_>>()
        })
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect();
    let grouped = exprs.iter().filter(|e| e.contains(" by (") || e.contains(" on (")).count();
    assert!(grouped >= 18, "{grouped} rules group or join");
    for e in &exprs {
        for part in e.split("by (").skip(1).chain(e.split("on (").skip(1)) {
            assert!(part.starts_with("region, "), "{e}");
        }
        assert!(!e.contains("cluster"), "{e}");
    }
    let d: Value =
        serde_json::from_str(&std::fs::read_to_string(other.path().join("grafana/hvstats.json")).unwrap())
            .unwrap();
    let cluster = &d["templating"]["list"][1];
    assert_eq!((&cluster["name"], &cluster["hide"]), (&Value::from("cluster"), &Value::from(0)));
    assert_eq!(cluster["query"]["query"], "label_values(hvstats_build_info, region)");
    for (title, _, expr) in dashboard_targets(&d) {
        assert!(expr.contains("{region=~\"$cluster\","), "{title}: {expr}");
    }
    // The shipped dashboard has the variable too, hidden at All: one Prometheus needs none.
    assert_eq!(dashboard()["templating"]["list"][1]["hide"], 2);
}

/// An agent-mode Prometheus of the cluster `cluster`, its work files under `work`: it scrapes the
/// exporter at `exporter` as host `hv-1:9966` (every cluster has a host of that name) and
/// remote-writes what it scrapes, labelled with its cluster, to the Prometheus at `central`.
fn cluster_agent(
    prometheus: &str,
    cluster: &str,
    exporter: SocketAddr,
    central: SocketAddr,
    work: &Path,
) -> KilledOnDrop {
    let config = format!(
        "global:\n  scrape_interval: 1s\n  external_labels:\n    cluster: {cluster}\n\
         scrape_configs:\n  - job_name: hvstats\n    static_configs:\n      - targets: ['{exporter}']\n\
         \x20   relabel_configs:\n      - target_label: instance\n        replacement: 'hv-1:9966'\n\
         remote_write:\n  - url: http://{central}/api/v1/write\n    queue_config:\n      batch_send_deadline: 1s\n"
    );
    start_prometheus_agent(prometheus, &config, work).0
}

/// The dashboard's variables, as Grafana lists them with `$cluster` at `cluster`: every value of
/// each (a regex of them), checked against what the clusters hold.
fn fleet_variables(web: SocketAddr, d: &Value, cluster: &str, deadline: Instant) -> BTreeMap<String, String> {
    let mut chosen = BTreeMap::from([("cluster".to_owned(), cluster.to_owned())]);
    for v in &d["templating"]["list"].as_array().unwrap()[2..] {
        let name = v["name"].as_str().unwrap().to_owned();
        let query = substituted(v["query"]["query"].as_str().unwrap(), &chosen);
        let pick = until(&format!("${name} of {cluster}"), deadline, || {
            let values = label_values(web, &query)?;
            let ok = match name.as_str() {
                "job" => values == ["hvstats"],
                "instance" => values == ["hv-1:9966"],
                "vm" => ["db-1", "web-1"].iter().all(|w| values.iter().any(|v| v == w)),
                _ => !values.is_empty(),
            };
            if ok { Ok(values.join("|")) } else { Err(format!("{query}: {values:?}")) }
        });
        chosen.insert(name, pick);
    }
    chosen
}

/// The clusters of the series the Prometheus at `web` answers `query` with (none where its result
/// drops the label), once it answers with some.
fn clusters_answering(web: SocketAddr, what: &str, query: &str, deadline: Instant) -> BTreeSet<String> {
    until(what, deadline, || {
        let data = api(web, &format!("/api/v1/query?query={}", url_encoded(query)))?;
        match data["result"].as_array() {
            Some(r) if !r.is_empty() => {
                Ok(r.iter().filter_map(|s| s["metric"]["cluster"].as_str().map(str::to_owned)).collect())
            }
            _ => Err("no series".into()),
        }
    })
}

#[test]
fn a_central_prometheus_fed_by_two_cluster_agents_answers_every_dashboard_query_per_cluster_and_across() {
    let test = "a_central_prometheus_fed_by_two_cluster_agents";
    let Some(prometheus) = prometheus_tool("prometheus", test) else { return };
    if jsonnet(test).is_none() {
        return;
    }
    // The dashboard as a fleet generates it (its cluster variable shown); the shipped rules.
    let rendered = TempDir::new("fleet-mixin");
    render_mixin(rendered.path(), "{showMultiCluster: true}");
    let d: Value =
        serde_json::from_str(&std::fs::read_to_string(rendered.path().join("grafana/hvstats.json")).unwrap())
            .unwrap();
    assert_eq!(d["templating"]["list"][1]["hide"], 0);

    // The central Prometheus: it scrapes nothing, receives remote writes and evaluates the mixin.
    let central_work = TempDir::new("fleet-central");
    let config = format!(
        "global:\n  evaluation_interval: 1s\nrule_files:\n  - {}\n  - {}\n",
        packaging("prometheus/hvstats.rules.yml").display(),
        packaging("prometheus/hvstats.alerts.yml").display(),
    );
    let (_central, central) = start_prometheus_with(
        prometheus,
        &config,
        central_work.path(),
        &["--web.enable-remote-write-receiver"],
    );

    // Two clusters, each a host with synthetic VMs, its exporter (histograms on, for the
    // heatmaps) and an agent of its own.
    let clusters = ["east", "west"];
    let mut running = Vec::new();
    for cluster in clusters {
        let (host, work) =
            (TempDir::new(&format!("fleet-{cluster}")), TempDir::new(&format!("fleet-{cluster}-agent")));
        let load = Load::start(host.path());
        let (exporter, addr) = serve(host.path(), &["--collector.histograms"]);
        let agent = cluster_agent(prometheus, cluster, addr, central, work.path());
        running.push((agent, exporter, load, host, work));
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    every_rule_evaluates(central, deadline);
    let listed = until("$cluster lists both clusters", deadline, || {
        let values = label_values(central, d["templating"]["list"][1]["query"]["query"].as_str().unwrap())?;
        if values == clusters { Ok(values) } else { Err(format!("{values:?}")) }
    });
    eprintln!("clusters: {listed:?}");

    // Every query of every panel (the observer's series aside: no observer here; the heatmaps on
    // classic buckets) answers for each cluster with that cluster's series only, and for All with
    // both clusters' wherever its series keep the label.
    let queries: Vec<(String, String)> = dashboard_targets(&d)
        .into_iter()
        .filter(|(_, kind, expr)| histogram_mode(kind, expr) != Some(Histograms::Native))
        .filter(|(_, _, expr)| !metric_names(expr).iter().any(|n| OBSERVER_SERIES.contains(&n.as_str())))
        .map(|(title, _, expr)| (title, expr))
        .collect();
    let mut labelled = BTreeSet::new();
    for cluster in clusters {
        let values = fleet_variables(central, &d, cluster, deadline);
        for (title, expr) in &queries {
            let query = substituted(expr, &values);
            let seen =
                clusters_answering(central, &format!("{cluster}: {title:?}: {query}"), &query, deadline);
            assert!(seen.iter().all(|c| c == cluster), "{cluster}: {title:?} answers with {seen:?}");
            if !seen.is_empty() {
                labelled.insert(title.clone());
            }
        }
    }
    let all = fleet_variables(central, &d, ".*", deadline);
    for (title, expr) in &queries {
        let query = substituted(expr, &all);
        if labelled.contains(title) {
            until(&format!("all: {title:?}: {query}"), deadline, || {
                let seen = clusters_answering(central, title, &query, deadline);
                if seen.len() == 2 { Ok(()) } else { Err(format!("{seen:?}")) }
            });
        } else {
            clusters_answering(central, &format!("all: {title:?}: {query}"), &query, deadline);
        }
    }
    eprintln!(
        "{} dashboard queries answer per cluster and across both; {} keep the cluster",
        queries.len(),
        labelled.len()
    );
    assert!(labelled.len() * 2 > queries.len(), "{labelled:?} of {queries:?}");

    // The numbers are each cluster's: one host up in each, two in all, and each cluster's db-1 is
    // a series of its own although both are db-1 on hv-1:9966.
    let value = |q: &str| {
        until(q, deadline, || {
            let data = api(central, &format!("/api/v1/query?query={}", url_encoded(q)))?;
            data["result"][0]["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or(format!("{data}"))
        })
    };
    let hosts =
        d["panels"].as_array().unwrap().iter().find(|p| p["title"] == "Hosts exporting").unwrap()["targets"]
            [0]["expr"]
            .as_str()
            .unwrap()
            .to_owned();
    for (cluster, hosts_up) in [("east", 1.0), ("west", 1.0), (".*", 2.0)] {
        let values = fleet_variables(central, &d, cluster, deadline);
        assert_eq!(value(&substituted(&hosts, &values)), hosts_up, "hosts exporting in {cluster}");
    }
    assert_eq!(value("count(vm:hvstats_exits:rate1m{instance=\"hv-1:9966\",vm=\"db-1\"} > 0)"), 2.0);

    // The alerts are evaluated per cluster: no observer exports in either, so each cluster's
    // host is pending HvstatsObserverAbsent (it fires after its 10 minutes).
    let absent = until("HvstatsObserverAbsent per cluster", deadline, || {
        let data = api(central, "/api/v1/alerts")?;
        let of: BTreeSet<String> = data["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == "HvstatsObserverAbsent")
            .filter_map(|a| a["labels"]["cluster"].as_str().map(str::to_owned))
            .collect();
        if of.len() == 2 { Ok(of) } else { Err(format!("{data}")) }
    });
    eprintln!("HvstatsObserverAbsent pending in {absent:?}");
}
