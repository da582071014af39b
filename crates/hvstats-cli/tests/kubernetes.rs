//! hvstats as a Kubernetes node agent (packaging/kubernetes/): the manifests read as the
//! Kubernetes objects they claim to be (the `kubernetes` Python package's models, through
//! packaging/kubernetes/check-manifests), the DaemonSet gives its two containers the privileges
//! the two systemd units give the two services (the capabilities of packaging/capabilities, the one
//! list, and no other), and the image packaging/kubernetes/build-image makes, run by podman with
//! the DaemonSet's capabilities, mounts and `--pid=host`, observes a QEMU of the host.
//!
//! Without python3's `kubernetes` package the manifest tests say "skipped" (and fail under
//! HVSTATS_REQUIRE_KUBERNETES=1, which .ci/run sets after installing it); without podman, or where
//! podman cannot run a container, the image test says "skipped" and why (and fails under
//! HVSTATS_REQUIRE_PODMAN=1).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    KilledOnDrop, QemuGuest, TempDir, counter_series, kvm_available, observer_capabilities, unit_setting,
};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The manifests hvstats ships.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("packaging/kubernetes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// check-manifests run over `files`: its exit status, standard output and error; `None` (the test
/// skipped) when the `kubernetes` package is missing.
fn check_manifests(test: &str, files: &[PathBuf]) -> Option<(bool, String, String)> {
    let out = Command::new("python3").arg(repo("packaging/kubernetes/check-manifests")).args(files).output();
    let Ok(out) = out else {
        skip(test, "HVSTATS_REQUIRE_KUBERNETES", "python3 is missing");
        return None;
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() == Some(2) && stderr.contains("pip install kubernetes") {
        skip(test, "HVSTATS_REQUIRE_KUBERNETES", &stderr);
        return None;
    }
    Some((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), stderr))
}

/// Says the test is skipped, and why; fails instead when `require` is set to 1.
fn skip(test: &str, require: &str, why: &str) {
    assert!(std::env::var(require).as_deref() != Ok("1"), "{test}: {why} (failing because {require}=1)");
    eprintln!("{test}: {}: skipped", why.trim());
}

/// The shipped manifests as check-manifests read them, by kind.
fn manifests(test: &str) -> Option<BTreeMap<String, Value>> {
    let (ok, stdout, stderr) = check_manifests(test, &manifest_files())?;
    assert!(ok, "the manifests are not valid Kubernetes objects:\n{stderr}");
    let objects: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    let mut by_kind = BTreeMap::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap().to_owned();
        assert!(by_kind.insert(kind.clone(), o).is_none(), "two objects of kind {kind}");
    }
    Some(by_kind)
}

fn unit(name: &str) -> String {
    std::fs::read_to_string(repo(&format!("packaging/systemd/{name}"))).unwrap()
}

/// The capabilities a unit's `key` (CapabilityBoundingSet=, AmbientCapabilities=) gives.
fn unit_capabilities(unit: &str, key: &str) -> Vec<String> {
    unit_setting(unit, key).iter().flat_map(|v| v.split_whitespace()).map(str::to_owned).collect()
}

/// The capabilities a container's securityContext adds, as the units name them (`CAP_BPF`).
fn added(container: &Value) -> Vec<String> {
    let add = container["security_context"]["capabilities"]["add"].as_array();
    add.map_or(Vec::new(), |a| a.iter().map(|c| format!("CAP_{}", c.as_str().unwrap())).collect())
}

#[test]
fn the_manifests_read_as_kubernetes_objects_of_their_kinds() {
    let Some(objects) = manifests("the_manifests_read_as_kubernetes_objects_of_their_kinds") else { return };
    assert_eq!(objects.keys().collect::<Vec<_>>(), ["DaemonSet", "Namespace", "PodMonitor", "Service"]);
    for o in objects.values().filter(|o| o["kind"] != "Namespace") {
        assert_eq!(o["namespace"], objects["Namespace"]["name"], "{o}");
    }
    let workload = &objects["DaemonSet"]["workload"];
    let pod_labels = &workload["pod_labels"];
    assert_eq!(&workload["selector"], pod_labels);
    // The Service and the PodMonitor find the DaemonSet's pods, at the exporter's named port.
    let service = &objects["Service"]["service"];
    assert_eq!(&service["selector"], pod_labels);
    let exporter = &workload["containers"]["exporter"];
    let port = &exporter["ports"][0];
    assert_eq!((&port["name"], &port["containerPort"]), (&"metrics".into(), &9966.into()));
    assert_eq!(service["ports"][0]["targetPort"], port["name"]);
    assert_eq!(exporter["args"][0], "serve");
    assert!(exporter["args"].as_array().unwrap().iter().any(|a| a == "--expect-observer"), "{exporter}");
    let monitor = &objects["PodMonitor"]["pod_monitor"];
    assert_eq!(&monitor["selector"]["matchLabels"], pod_labels);
    let endpoint = &monitor["endpoints"][0];
    assert_eq!(endpoint["port"], port["name"]);
    // Else Prometheus renames a VM's `namespace` label (a KubeVirt VMI's) to `exported_namespace`.
    assert_eq!(endpoint["honorLabels"], true);
    // The image build-image makes of this version.
    let image = format!("localhost/hvstats:{}", env!("CARGO_PKG_VERSION"));
    for c in workload["containers"].as_object().unwrap().values() {
        assert_eq!(c["image"], image.as_str(), "{c}");
    }
    assert_eq!(workload["containers"]["observer"]["args"], serde_json::json!(["observe", "--all"]));
}

#[test]
fn a_field_no_kubernetes_object_has_is_refused() {
    let test = "a_field_no_kubernetes_object_has_is_refused";
    let tmp = TempDir::new("k8s-misspelt");
    let shipped = std::fs::read_to_string(repo("packaging/kubernetes/daemonset.yaml")).unwrap();
    // `hostPid`: the API server of old dropped it unsaid, and the observer would see no VMM.
    let misspelt = shipped.replace("hostPID: true", "hostPid: true");
    assert_ne!(misspelt, shipped);
    let file = tmp.path().join("daemonset.yaml");
    std::fs::write(&file, misspelt).unwrap();
    let Some((ok, _, stderr)) = check_manifests(test, &[file]) else { return };
    assert!(!ok && stderr.contains("not a V1DaemonSet"), "{stderr}");
}

#[test]
fn the_daemonsets_containers_hold_the_units_privileges() {
    let Some(objects) = manifests("the_daemonsets_containers_hold_the_units_privileges") else { return };
    let workload = &objects["DaemonSet"]["workload"];
    let (observer, exporter) = (&workload["containers"]["observer"], &workload["containers"]["exporter"]);
    let (observe_unit, serve_unit) = (unit("hvstats-observe.service"), unit("hvstats-serve.service"));
    // One list: the observer unit's bounding set and the observer container's capabilities; no
    // ambient ones (the observer runs as root and holds its bounding set).
    let list = observer_capabilities();
    assert_eq!(list, ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE", "CAP_PERFMON", "CAP_BPF"]);
    assert_eq!(unit_capabilities(&observe_unit, "CapabilityBoundingSet"), list);
    assert_eq!(unit_capabilities(&observe_unit, "AmbientCapabilities"), Vec::<String>::new());
    assert_eq!(added(observer), list, "{observer}");
    // The exporter: none, in both.
    assert_eq!(unit_capabilities(&serve_unit, "CapabilityBoundingSet"), Vec::<String>::new());
    assert_eq!(unit_capabilities(&serve_unit, "AmbientCapabilities"), Vec::<String>::new());
    assert_eq!(added(exporter), Vec::<String>::new(), "{exporter}");
    for (unit, c) in [(&observe_unit, observer), (&serve_unit, exporter)] {
        let sc = &c["security_context"];
        // Everything else dropped, whatever the runtime's default set.
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{c}");
        // NoNewPrivileges=yes; ProtectSystem=strict: a read-only root. Root, as the units run.
        assert_eq!(unit_setting(unit, "NoNewPrivileges"), ["yes"]);
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{c}");
        assert_eq!(unit_setting(unit, "ProtectSystem"), ["strict"]);
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{c}");
        assert_eq!((&sc["privileged"], &sc["runAsUser"]), (&false.into(), &0.into()), "{c}");
    }
    // The host's processes; the pod's own network (the observer listens to none, as under
    // PrivateNetwork=yes; the exporter listens on the pod's address).
    assert_eq!(workload["host_pid"], true);
    assert!(workload["host_network"] != true);
    assert_eq!(unit_setting(&observe_unit, "PrivateNetwork"), ["yes"]);
    the_daemonsets_mounts_are_the_units_paths(workload, &observe_unit);
}

/// The host paths of each container, and whether it may write them: what the units see.
fn the_daemonsets_mounts_are_the_units_paths(workload: &Value, observe_unit: &str) {
    let host_path = |volume: &Value| -> String {
        let v = workload["volumes"].as_array().unwrap().iter().find(|v| v["name"] == volume["name"]).unwrap();
        v["hostPath"]["path"].as_str().unwrap().to_owned()
    };
    let mounts = |container: &str| -> Vec<(String, String, bool)> {
        let mounts = workload["containers"][container]["volume_mounts"].as_array().unwrap();
        let mut m: Vec<_> = mounts
            .iter()
            .map(|m| (host_path(m), m["mountPath"].as_str().unwrap().to_owned(), m["readOnly"] == true))
            .collect();
        m.sort();
        m
    };
    // A host path mounted where it is on the host.
    let mount = |p: &str, read_only: bool| (p.to_owned(), p.to_owned(), read_only);
    // RuntimeDirectory=hvstats is /run/hvstats; the one path of /sys the observer writes is its
    // bpffs directory (ReadWritePaths=), the rest of bpffs and tracefs read-only as
    // ProtectSystem=strict leaves them; the kubelet's pod volumes are read, never written.
    assert_eq!(unit_setting(observe_unit, "RuntimeDirectory"), ["hvstats"]);
    assert_eq!(unit_setting(observe_unit, "ReadWritePaths"), ["-/sys/fs/bpf/hvstats"]);
    assert_eq!(
        mounts("observer"),
        [
            mount("/run/hvstats", false),
            mount("/sys/fs/bpf", true),
            mount("/sys/fs/bpf/hvstats", false),
            mount("/sys/kernel/tracing", true),
            mount("/var/lib/kubelet/pods", true),
        ]
    );
    assert_eq!(mounts("exporter"), [mount("/run/hvstats", true)]);
}

/// `podman` with the options that make it run here: the cgroupfs manager (no systemd manages
/// cgroups for a test), and runc where installed (crun refuses hosts with both cgroup
/// hierarchies mounted); why not, where there is no podman.
fn podman() -> Result<Vec<String>, String> {
    let mut base = vec!["podman".to_owned(), "--cgroup-manager=cgroupfs".to_owned()];
    if Command::new("runc").arg("--version").output().is_ok_and(|o| o.status.success()) {
        base.push("--runtime=runc".to_owned());
    }
    match Command::new(&base[0]).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(base),
        _ => Err("podman is missing".to_owned()),
    }
}

/// The limits a container is given: a root without CAP_SYS_RESOURCE (a host that is itself a
/// container) cannot raise them to the engine's defaults, so descriptors are this process's own,
/// and processes 4096 (the count is of uid 0's processes on the host, a few hundred on a test
/// host; the observer unit's TasksMax=64 needs far fewer).
fn ulimits() -> Vec<String> {
    let mut nofile = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the rlimit it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut nofile) }, 0);
    let n = nofile.rlim_max;
    ["--ulimit".to_owned(), format!("nofile={n}:{n}"), "--ulimit".to_owned(), "nproc=4096:4096".to_owned()]
        .into()
}

/// The in-kernel counts an observer in a container keeps in the host's bpffs (keyed by its
/// runtime directory's path in the container), removed when dropped: its container is removed
/// at once, so it ends as a killed observer does, leaving them to a next observer of that path.
/// Counts that were there before the test (an observer of this host's) are left alone.
struct KeptByTheContainer(Option<PathBuf>);

impl KeptByTheContainer {
    fn at(runtime: &str) -> Self {
        let dir = hvstats_host::bpf::keep::identity_path(Path::new(runtime));
        Self((!dir.exists()).then_some(dir))
    }
}

impl Drop for KeptByTheContainer {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            hvstats_host::bpf::keep::remove_tree(dir);
        }
    }
}

/// A container, removed (stopped at once) when dropped; its podman client killed.
struct Container {
    podman: Vec<String>,
    name: String,
    client: KilledOnDrop,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.podman[0])
            .args(&self.podman[1..])
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.client.0.kill();
    }
}

/// The podman flags that give a container what the DaemonSet gives `container`: its
/// capabilities, seccomp profile, read-only root, no privilege gain, and its host paths, each
/// host path `host` maps (the runtime directory to the test's own) where it is mounted.
fn daemonset_flags(workload: &Value, container: &str, host: impl Fn(&str) -> PathBuf) -> Vec<String> {
    let c = &workload["containers"][container];
    let sc = &c["security_context"];
    let mut flags: Vec<String> = Vec::new();
    let mut when = |yes: bool, flag: &str| flags.extend(yes.then(|| flag.to_owned()));
    when(workload["host_pid"] == true, "--pid=host");
    when(sc["allowPrivilegeEscalation"] == false, "--security-opt=no-new-privileges");
    when(sc["readOnlyRootFilesystem"] == true, "--read-only");
    when(sc["capabilities"]["drop"] == serde_json::json!(["ALL"]), "--cap-drop=all");
    flags.extend(added(c).iter().map(|cap| format!("--cap-add={cap}")));
    if sc["seccompProfile"]["type"] == "Unconfined" {
        flags.push("--security-opt=seccomp=unconfined".into());
    }
    for m in c["volume_mounts"].as_array().unwrap() {
        let volume = workload["volumes"].as_array().unwrap().iter().find(|v| v["name"] == m["name"]).unwrap();
        let source = host(volume["hostPath"]["path"].as_str().unwrap());
        let mut options = if m["readOnly"] == true { "ro" } else { "rw" }.to_owned();
        if m["mountPropagation"] == "HostToContainer" {
            options.push_str(",rslave");
        }
        flags.push(format!("--volume={}:{}:{options}", source.display(), m["mountPath"].as_str().unwrap()));
    }
    flags
}

/// Builds the image of this build with build-image, under a name of this test's own.
fn build_image<'a>(podman: &'a [String], out: &Path) -> Result<Image<'a>, String> {
    let name = format!("localhost/hvstats-test-{}:{}", std::process::id(), env!("CARGO_PKG_VERSION"));
    let built = Command::new(repo("packaging/kubernetes/build-image"))
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .arg(out)
        .env("HVSTATS_IMAGE", &name)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&built.stdout);
    if !built.status.success() || said.lines().last() != Some(name.as_str()) {
        return Err(format!("build-image: {said}{}", String::from_utf8_lossy(&built.stderr)));
    }
    let image = Image { podman, name };
    // It runs, with nothing but what the image holds.
    let ran = Command::new(&podman[0])
        .args(&podman[1..])
        .args(["run", "--rm"])
        .args(ulimits())
        .args([&image.name, "--version"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    if said.trim() != format!("hvstats {}", env!("CARGO_PKG_VERSION")) {
        return Err(format!(
            "podman cannot run a container here: {said}{}",
            String::from_utf8_lossy(&ran.stderr)
        ));
    }
    Ok(image)
}

/// An image, removed when dropped.
struct Image<'a> {
    podman: &'a [String],
    name: String,
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        let _ = Command::new(&self.podman[0])
            .args(&self.podman[1..])
            .args(["rmi", "--force", &self.name])
            .output();
    }
}

/// Starts `container` of the DaemonSet from `image` as podman's container `name`, with `args`
/// (the manifest's, or others), its standard output piped, its standard error to `log`.
fn start(
    podman: &[String],
    image: &str,
    name: &str,
    flags: &[String],
    args: &[String],
    log: &Path,
) -> Container {
    let child = Command::new(&podman[0])
        .args(&podman[1..])
        .args(["run", "--rm", "--name", name])
        .args(ulimits())
        .args(flags)
        .arg(image)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    Container { podman: podman.to_vec(), name: name.to_owned(), client: KilledOnDrop(child) }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_image_with_the_daemonsets_privileges_observes_a_qemu_of_the_host() {
    let test = "the_image_with_the_daemonsets_privileges_observes_a_qemu_of_the_host";
    if !kvm_available(test) {
        return;
    }
    let Some(objects) = manifests(test) else { return };
    let podman = match podman() {
        Ok(p) => p,
        Err(why) => return skip(test, "HVSTATS_REQUIRE_PODMAN", &why),
    };
    let tmp = TempDir::new("k8s-image");
    let image = match build_image(&podman, &tmp.path().join("image")) {
        Ok(image) => image,
        Err(why) => return skip(test, "HVSTATS_REQUIRE_PODMAN", &why),
    };
    let workload = &objects["DaemonSet"]["workload"];
    // The node's paths, but the runtime directory (the test's own) and the kubelet's (none here).
    let runtime = tmp.path().join("run");
    let pods = tmp.path().join("pods");
    for dir in [&runtime, &pods] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    // What hostPath's DirectoryOrCreate makes on a node.
    std::fs::create_dir_all("/sys/fs/bpf/hvstats").unwrap();
    let host = |path: &str| match path {
        "/run/hvstats" => runtime.clone(),
        "/var/lib/kubelet/pods" => pods.clone(),
        other => PathBuf::from(other),
    };
    let tag = format!("k8s-{}", std::process::id());
    let qemu = QemuGuest::start(tmp.path(), &tag);

    let id = std::process::id();
    let observer_log = tmp.path().join("observer.log");
    let observer_args = strings(&workload["containers"]["observer"]["args"]);
    let observer_flags =
        [daemonset_flags(workload, "observer", host), vec!["--network=none".into()]].concat();
    // Dropped after the observer's container (declared before it): what its observer kept.
    let _kept = KeptByTheContainer::at("/run/hvstats");
    let _observer = start(
        &podman,
        &image.name,
        &format!("hvstats-observer-{id}"),
        &observer_flags,
        &observer_args,
        &observer_log,
    );
    // The exporter as the DaemonSet runs it, on the host's loopback (podman's networks need more
    // than a test host may have) at a port of the kernel's choosing.
    let mut exporter_args = strings(&workload["containers"]["exporter"]["args"]);
    *exporter_args.iter_mut().find(|a| *a == ":9966").unwrap() = "127.0.0.1:0".to_owned();
    let exporter_flags =
        [daemonset_flags(workload, "exporter", host), vec!["--network=host".into()]].concat();
    let exporter_log = tmp.path().join("exporter.log");
    let mut exporter = start(
        &podman,
        &image.name,
        &format!("hvstats-exporter-{id}"),
        &exporter_flags,
        &exporter_args,
        &exporter_log,
    );
    let addr = common::serving_addr(&mut exporter.client.0);

    // The VM, by its QEMU's name and process, with port accesses counted in the kernel by the
    // observer's programs (SeaBIOS touches ports within seconds, longer on a busy host).
    let io = format!("hvstats_vp_intercepts{{vm=\"{tag}\",vp=\"0\",intercept=\"io\"}}");
    let t = Instant::now();
    let metrics = loop {
        let metrics = common::http_get(addr, "/metrics");
        if counter_series(&metrics, &tag).get(&io).is_some_and(|(v, _)| *v > 0.0) {
            break metrics;
        }
        let log = std::fs::read_to_string(&observer_log).unwrap_or_default();
        assert!(t.elapsed() < Duration::from_secs(120), "no {io} > 0 in 120 s:\n{metrics}\nobserver:\n{log}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let info =
        metrics.lines().find(|l| l.starts_with("hvstats_vm_info{") && l.contains(&format!("vm=\"{tag}\"")));
    assert!(info.is_some_and(|l| l.contains(&format!("vmm_pid=\"{}\"", qemu.pid()))), "{metrics}");
    assert!(metrics.contains("hvstats_observer_up 1"), "{metrics}");
    let log = std::fs::read_to_string(&observer_log).unwrap();
    // In the kernel, kept in bpffs beyond this observer (its directory is writable to it).
    assert!(log.contains("counting in-kernel") && !log.contains("not kept beyond"), "{log}");
}
