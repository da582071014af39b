//! KVM's statistics of a libvirt domain from libvirt's bulk statistics
//! (`virConnectGetAllDomainStats`, the vCPU, VM and state groups: what `virsh domstats --vcpu
//! --vm --state` shows), and the domain's run state, over a read-only connection that cannot
//! taint the domain.
//!
//! The QEMU process is matched to its domain by the UUID libvirt passes it (`-uuid`). libvirt
//! reports each vCPU's KVM statistics as `vcpu.<N>.<statistic>.sum` (`.cur`, `.max` for instant
//! and peak ones) and the VM's as `vm.<statistic>.sum`, KVM's whole-life values; libvirt 9 leaves
//! the halt histograms out, so those counters are not given here. Where libvirt is absent (no
//! socket) or the process is not one of its domains, the VM has no such source and nothing is
//! said.
//!
//! A session is bound to the VMM: it is opened only when root listens on the socket (the
//! kernel's record, [`Libvirt::connect`]) and that daemon's QEMU driver records this process as
//! the domain's QEMU (its `/run/libvirt/qemu/NAME.pid`, read from the daemon's own root). A
//! process that copies a domain's `-uuid` onto its command line is not given that domain's
//! statistics or name, and a socket some other user serves is never spoken to; either is
//! refused, said once when the VM is attached, and the source stays down.
//!
//! A VMM in a KubeVirt pod's cgroup is read through its pod's own libvirt daemon instead, where
//! one is found ([`super::pod_libvirt`]): a daemon of the pod's unprivileged user, believed for
//! the VMM only by that module's rule, which also gives the VM KubeVirt's identity from the
//! domain it runs (`identity_source="pod-libvirt+cgroup"`).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::partition;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::vm_sources::Origin;
use hvstats_abi::vm_state::VmState;

use super::kvm_stat_map::{self, KvmStatReading};
use super::pod_libvirt::{self, PodSocket};
use super::vm_source::{Learned, Named, Peer, PeerKind, PeerState, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use crate::discovery::Procfs;
use hvstats_host::error_chain::error_chain;
use hvstats_sources::counter_source::{CounterSource, Gives, Object};
use hvstats_vmm::libvirt::{
    Domain, Libvirt, LibvirtError, SOCKETS, STATS_STATE, STATS_VCPU, STATS_VM, TypedValue,
};

/// The deadline of one exchange with libvirt.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Where libvirt's QEMU driver, run by root, records the pid of each running domain's QEMU
/// (`NAME.pid`), under the daemon's root.
const PID_DIR: &str = "run/libvirt/qemu";

/// Statistics by name, as one reading of libvirt gave them.
#[derive(Clone, Debug, Default)]
struct Stats(BTreeMap<String, u64>);

impl KvmStatReading for Stats {
    fn value(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }

    fn buckets(&self, _name: &str) -> Option<&[u64]> {
        None
    }
}

/// A libvirt domain's statistics.
#[derive(Debug)]
pub struct LibvirtStats {
    socket: PathBuf,
    conn: Option<Libvirt>,
    domain: Domain,
    /// The VMM process, which the daemon must record as the domain's QEMU.
    vmm: i32,
    /// Why the socket or the domain was refused (the session is then never opened).
    refused: Option<String>,
    vp_count: usize,
    vcpus: BTreeMap<u32, Stats>,
    vm: Stats,
    /// The domain's run state, as the last reading said it.
    state: Option<VmState>,
    error: Option<String>,
    /// OpenStack Nova's identity of the domain, and when its metadata was last asked for.
    nova: Option<hvstats_platform::Identity>,
    nova_asked: Option<std::time::Instant>,
    /// The domain's UUID, Nova's instance id.
    uuid: hvstats::vmm::VmUuid,
    /// The VMM's pod's own libvirt socket, where the session is with that daemon.
    pod: Option<PodSocket>,
    /// KubeVirt's identity of the VM, from the domain the pod's daemon runs.
    kubevirt: Option<hvstats_platform::Identity>,
}

/// Why no session with libvirt was opened for the VMM.
enum Unbound {
    /// No daemon answers, or it has no domain of the VMM's UUID: the VM has no libvirt source.
    Absent(String),
    /// A daemon that is not to be believed for this VMM, and why.
    Refused(String),
}

/// The read-only socket to use: the one the options name, else the socket of libvirt's own
/// `LIBVIRT_DEFAULT_URI` (`qemu:///system?socket=…`), else the first of the usual places that
/// exists.
fn socket(at: &VmAttach<'_>) -> Option<PathBuf> {
    if let Some(path) = &at.options.libvirt {
        return Some(path.clone());
    }
    let from_uri = std::env::var("LIBVIRT_DEFAULT_URI").ok().and_then(|uri| {
        let (_, query) = uri.split_once('?')?;
        let socket = query.split('&').find_map(|kv| kv.strip_prefix("socket="))?;
        // The read-write socket's read-only sibling, as libvirt names them.
        let ro = if socket.ends_with("-ro") { socket.to_owned() } else { format!("{socket}-ro") };
        Some(PathBuf::from(ro))
    });
    from_uri.or_else(|| SOCKETS.iter().map(PathBuf::from).find(|p| p.exists()))
}

/// Finds the libvirt domain whose UUID the QEMU process was given; `None` when libvirt is absent
/// or has no such domain. For a VMM in a pod's cgroup, the pod's own daemon where one is found,
/// else the system's. A daemon that is not to be believed for the VMM gives a source that is
/// refused (said once, at attach) and gives nothing.
///
/// # Errors
/// Never: a libvirt that fails after it was found is the source's own state.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let Some(uuid) = at.procfs.vm_uuid(at.pid) else { return Ok(None) };
    let pod = pod_libvirt::find(at.procfs, at.pid, at.options.kubelet_root.as_deref());
    let Some(socket) = pod.as_ref().map(|p| p.path.clone()).or_else(|| socket(at)) else { return Ok(None) };
    let mut me = LibvirtStats {
        socket,
        conn: None,
        domain: Domain { name: String::new(), uuid: uuid.bytes(), id: -1 },
        vmm: at.pid,
        refused: None,
        vp_count: at.fds.vcpus.len(),
        vcpus: BTreeMap::new(),
        vm: Stats::default(),
        state: None,
        error: None,
        nova: None,
        nova_asked: None,
        uuid,
        pod,
        kubevirt: None,
    };
    match me.bind(at.procfs) {
        Ok(()) => Ok(Some(Box::new(me))),
        Err(Unbound::Refused(why)) => Ok(Some(Box::new(me.refuse(why)))),
        Err(Unbound::Absent(_)) => Ok(None),
    }
}

/// Whether the daemon serving `conn` runs `domain` in process `vmm`, by its QEMU driver's record
/// of the domain's QEMU (`/run/libvirt/qemu/NAME.pid`, root's file, read through
/// `/proc/DAEMON/root` so that a daemon in a mount namespace of its own is read as it sees it);
/// why not, when not.
fn runs_in(conn: &Libvirt, domain: &Domain, vmm: i32) -> Result<(), String> {
    let name = &domain.name;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("libvirt names the domain {name:?}, which names no record of its QEMU"));
    }
    let path = PathBuf::from(format!("/proc/{}/root/{PID_DIR}/{name}.pid", conn.daemon()));
    let cannot =
        |e: std::io::Error| format!("cannot read libvirt's record of its QEMU, {}: {e}", path.display());
    let file = std::fs::File::open(&path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() || meta.uid() != 0 {
        return Err(format!("{} is not a file of root's: not libvirt's record of its QEMU", path.display()));
    }
    let mut text = String::new();
    file.take(64).read_to_string(&mut text).map_err(cannot)?;
    match text.trim().parse::<i32>() {
        Ok(pid) if pid == vmm => Ok(()),
        Ok(pid) => Err(format!(
            "libvirt's domain {name:?} with this process's UUID runs in pid {pid}, not in this process"
        )),
        Err(_) => Err(format!("{} holds no pid: {:?}", path.display(), text.trim())),
    }
}

/// `vcpu.<N>.<name>.<sum|cur|max>` or `vm.<name>.<sum|cur|max>`: the object and the statistic.
fn parse_field(field: &str) -> Option<(Option<u32>, &str)> {
    let (object, rest) = if let Some(rest) = field.strip_prefix("vcpu.") {
        let (n, rest) = rest.split_once('.')?;
        (Some(n.parse().ok()?), rest)
    } else {
        (None, field.strip_prefix("vm.")?)
    };
    let name = rest
        .strip_suffix(".sum")
        .or_else(|| rest.strip_suffix(".cur"))
        .or_else(|| rest.strip_suffix(".max"))?;
    (!name.contains('.')).then_some((object, name))
}

impl LibvirtStats {
    /// This source, refused for `why`: it never connects and gives nothing.
    fn refuse(mut self, why: String) -> Self {
        self.error = Some(format!("refused libvirt's session: {why}"));
        self.refused = Some(why);
        self
    }

    /// Opens a session with the daemon at the socket and binds it to the VMM: the domain of the
    /// VMM's UUID, which a root daemon records as run by the VMM ([`runs_in`]), or which the
    /// VMM's pod's own daemon runs by [`pod_libvirt::bind`]'s rule.
    fn bind(&mut self, procfs: &Procfs) -> Result<(), Unbound> {
        self.kubevirt = None;
        let absent = |e: LibvirtError| Unbound::Absent(error_chain(&e));
        let connected = match &self.pod {
            Some(_) => Libvirt::connect_any(&self.socket, TIMEOUT),
            None => Libvirt::connect(&self.socket, TIMEOUT),
        };
        let mut conn = match connected {
            Ok(conn) => conn,
            Err(e @ LibvirtError::Foreign { .. }) => return Err(Unbound::Refused(e.to_string())),
            Err(e) => return Err(absent(e)),
        };
        let domain = match (conn.lookup_by_uuid(self.uuid.bytes()), &self.pod) {
            (Ok(domain), _) => domain,
            (Err(e), Some(_)) if e.is_no_domain() => {
                return Err(Unbound::Refused(format!(
                    "the pod's libvirt has no domain of the VMM's UUID {}",
                    self.uuid
                )));
            }
            (Err(e), _) => return Err(absent(e)),
        };
        match (&self.pod, conn.daemon_uid()) {
            (Some(pod), uid) if uid != 0 => pod_libvirt::bind(procfs, self.vmm, pod, &conn, &domain),
            _ => runs_in(&conn, &domain, self.vmm),
        }
        .map_err(Unbound::Refused)?;
        self.kubevirt = self
            .pod
            .as_ref()
            .map(|pod| hvstats_platform::kubevirt::from_pod_daemon(&domain.name, &pod.pod_uid));
        self.domain = domain;
        self.conn = Some(conn);
        Ok(())
    }

    fn read_once(&mut self, procfs: &Procfs) -> Result<(), String> {
        if self.conn.is_none() {
            // A daemon started again is bound to the VMM again.
            self.bind(procfs).map_err(|(Unbound::Absent(why) | Unbound::Refused(why))| why)?;
        }
        let Some(conn) = self.conn.as_mut() else { return Ok(()) };
        let fields = conn
            .domain_stats(&self.domain, STATS_VCPU | STATS_VM | STATS_STATE)
            .map_err(|e| error_chain(&e))?;
        let (mut vcpus, mut vm) = (BTreeMap::<u32, Stats>::new(), Stats::default());
        let (mut state, mut reason) = (None, 0);
        for (field, value) in fields {
            match (field.as_str(), &value) {
                ("state.state", TypedValue::Int(v)) => state = i64::try_from(*v).ok(),
                ("state.reason", TypedValue::Int(v)) => reason = i64::try_from(*v).unwrap_or(0),
                _ => {}
            }
            let value = match value {
                TypedValue::Int(v) => u64::try_from(v).unwrap_or(0),
                TypedValue::Bool(b) => u64::from(b),
                _ => continue,
            };
            match parse_field(&field) {
                Some((Some(n), name)) => {
                    vcpus.entry(n).or_default().0.insert(name.to_owned(), value);
                }
                Some((None, name)) => {
                    vm.0.insert(name.to_owned(), value);
                }
                None => {}
            }
        }
        self.state = state.map(|s| VmState::from_libvirt(s, reason));
        self.vcpus = vcpus;
        self.vm = vm;
        self.read_nova()
    }

    /// Asks for the domain's Nova metadata (namespace 1.1, then 1.0) once a
    /// [`hvstats_platform::REREAD_PERIOD`], so a resize is seen within it. The daemon is root's and
    /// runs the domain in the VMM (checked at connect): its word is the platform's.
    fn read_nova(&mut self) -> Result<(), String> {
        let due = self.nova_asked.is_none_or(|at| at.elapsed() >= hvstats_platform::REREAD_PERIOD);
        let Some(conn) = self.conn.as_mut().filter(|_| due) else { return Ok(()) };
        self.nova_asked = Some(std::time::Instant::now());
        let uuid = self.uuid.to_string();
        self.nova = None;
        for ns in hvstats_platform::nova::NAMESPACES {
            let Some(xml) = conn.domain_metadata(&self.domain, ns).map_err(|e| error_chain(&e))? else {
                continue;
            };
            self.nova = hvstats_platform::nova::identity(&xml, Some(&uuid), true).ok();
            break;
        }
        Ok(())
    }
}

impl CounterSource for LibvirtStats {
    fn name(&self) -> &'static str {
        "libvirt"
    }

    fn gives(&self) -> Gives {
        // A VP counter is given only when libvirt reports it for every vCPU.
        let mut gives = kvm_stat_map::gives(Some(&self.vm), &self.vcpus, self.vp_count);
        if self.state.is_some() {
            gives.partition = gives.partition.union(&CounterSet::of(&[partition::VM_STATE]));
        }
        gives
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        match object {
            // libvirt numbers vCPUs as QEMU does (cpu-index), the order of their KVM ids.
            Object::Vp(index) => {
                if let Some(s) = self.vcpus.get(&index) {
                    kvm_stat_map::write(ObjectKind::Vp, page, only, s);
                }
            }
            Object::Partition => {
                kvm_stat_map::write(ObjectKind::Partition, page, only, &self.vm);
                if let Some(state) = self.state.filter(|_| only.contains(partition::VM_STATE)) {
                    page.set(partition::VM_STATE, state.code());
                }
            }
        }
    }

    fn unavailable(&self) -> Vec<String> {
        self.error.iter().cloned().collect()
    }
}

impl VmSource for LibvirtStats {
    fn named(&mut self) -> Named {
        Named { vm_name: self.refused.is_none().then(|| self.domain.name.clone()), ..Named::default() }
    }

    fn read(&mut self, vm: &VmView<'_>) -> Learned {
        if let Some(refused) = &self.refused {
            let why = self.error.clone().unwrap_or_else(|| refused.clone());
            return Learned {
                peer: Some(Peer { kind: PeerKind::Service, state: PeerState::Down(why.clone()) }),
                error: Some(why),
                refused: Some(refused.clone()),
                ..Learned::holding(0)
            };
        }
        match self.read_once(vm.procfs) {
            Ok(()) => self.error = None,
            Err(e) => {
                // Its counters stop being available rather than going stale; the next refresh
                // connects again.
                self.error = Some(e);
                self.conn = None;
                self.vcpus.clear();
                self.vm = Stats::default();
                self.state = None;
            }
        }
        // libvirt answers for the domain (it asks QEMU itself: a stopped QEMU is a libvirt that
        // does not answer within the deadline); each refresh asks again.
        let state = match &self.error {
            None => PeerState::Up,
            Some(why) => PeerState::Down(why.clone()),
        };
        Learned {
            peer: Some(Peer { kind: PeerKind::Service, state }),
            error: self.error.clone(),
            vm_state: self.state,
            platform: self.nova.clone().or_else(|| self.kubevirt.clone()),
            ..Learned::holding(usize::from(self.conn.is_some()))
        }
    }

    fn origin(&self) -> Origin {
        Origin::VcpuCreation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_name_the_vcpu_or_the_vm_and_the_statistic() {
        assert_eq!(parse_field("vcpu.0.halt_exits.sum"), Some((Some(0), "halt_exits")));
        assert_eq!(parse_field("vcpu.12.blocking.cur"), Some((Some(12), "blocking")));
        assert_eq!(parse_field("vm.max_mmu_rmap_size.max"), Some((None, "max_mmu_rmap_size")));
        assert_eq!(parse_field("vm.remote_tlb_flush.sum"), Some((None, "remote_tlb_flush")));
        for other in
            ["vcpu.0.time", "vcpu.current", "vcpu.x.halt_exits.sum", "balloon.current", "vcpu.0.a.b.sum"]
        {
            assert_eq!(parse_field(other), None, "{other}");
        }
    }
}
