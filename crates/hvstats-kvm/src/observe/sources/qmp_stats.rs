//! KVM's statistics of a QEMU VM through its QMP socket (`query-stats`): every vCPU statistic
//! and VM statistic the catalog keys, counted from attach (the value at attach is taken off).
//! QMP also says which thread runs each vCPU (`query-cpus-fast`) and the VM's name and UUID
//! (`query-name`, `query-uuid`: what QEMU itself holds, whatever its command line seems to say),
//! which the observer asks this source for.
//!
//! A peer out of step (late, lying, gone) is not asked again: its counters stop being available
//! rather than going stale.

use std::collections::BTreeMap;
use std::time::Duration;

use hvstats::SharedPage;
use hvstats_abi::catalog::{self, Maintained};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{KvmStat, Source};
use hvstats_abi::{Counter, ObjectKind};

use super::vm_source::{VcpuThread, VmAttach, VmSource, VmView};
use crate::observe::attach::ObserveError;
use crate::observe::qmp::{KvmStatsReply, Qmp, QmpError, StatValues};
use crate::sources::counter_source::{CounterSource, Gives, Object};

/// The deadline of one QMP exchange (the connect and greeting, or one command and its reply).
pub const QMP_TIMEOUT: Duration = Duration::from_secs(2);

/// A VM's QMP session and what it last said.
#[derive(Debug)]
pub struct QmpStats {
    qmp: Option<Qmp>,
    error: Option<String>,
    name: Option<String>,
    uuid: Option<hvstats::vmm::VmUuid>,
    /// KVM statistics at attach; `None` when QEMU gave none (no `query-stats`, no KVM provider).
    at_attach: Option<KvmStatsReply>,
    /// The last reading.
    now: Option<KvmStatsReply>,
    /// Each VP's QOM path, by VP index, as the observer knew it at the last reading.
    qom_paths: BTreeMap<u32, String>,
}

/// Connects to the VM's QMP socket when one is given, and asks its name and its statistics at
/// attach. A socket that cannot be used is a source that gives nothing and says why.
///
/// # Errors
/// Never: a failed QMP session is the source's own state.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let Some(path) = &at.options.qmp else { return Ok(None) };
    let mut me = QmpStats {
        qmp: None,
        error: None,
        name: None,
        uuid: None,
        at_attach: None,
        now: None,
        qom_paths: BTreeMap::new(),
    };
    match Qmp::connect_with(path, QMP_TIMEOUT, at.options.cancel.clone()) {
        Ok(q) => me.qmp = Some(q),
        Err(e) => me.error = Some(hvstats::snapshot::error_chain(&e)),
    }
    if let Some(q) = me.qmp.as_mut() {
        let asked = match q.query_name() {
            Ok(n) => {
                me.name = n;
                // A QEMU without `query-uuid` (an error answer) still has its statistics.
                match q.query_uuid() {
                    Ok(u) => me.uuid = u,
                    Err(e) if e.is_command_error() => {}
                    Err(e) => me.failed(&e),
                }
                match me.qmp.as_mut() {
                    Some(q) => q.query_kvm_stats(),
                    None => Ok(None),
                }
            }
            Err(e) => Err(e),
        };
        match asked {
            Ok(s) => me.at_attach = s,
            Err(e) => me.failed(&e),
        }
    }
    Ok(Some(Box::new(me)))
}

impl QmpStats {
    /// Notes a failed QMP exchange; a session out of step (late, lying, gone) is dropped.
    fn failed(&mut self, e: &QmpError) {
        self.error = Some(hvstats::snapshot::error_chain(e));
        if !e.is_command_error() {
            self.qmp = None;
            self.at_attach = None;
            self.now = None;
        }
    }

    /// The statistics of `object` now and at attach.
    fn values(&self, object: Object) -> Option<(&StatValues, &StatValues)> {
        let (now, then) = (self.now.as_ref()?, self.at_attach.as_ref()?);
        match object {
            Object::Partition => Some((&now.vm, &then.vm)),
            Object::Vp(index) => {
                let q = self.qom_paths.get(&index)?;
                Some((now.vcpus.get(q)?, then.vcpus.get(q)?))
            }
        }
    }
}

/// The statistics the observed key of `counter` sums, for `kind`'s object.
fn stat_names(counter: &Counter, kind: ObjectKind) -> Option<&'static [&'static str]> {
    match (kind, catalog::observed(counter).and_then(Maintained::source)?) {
        (ObjectKind::Vp, Source::KvmStats(KvmStat::Vcpu(names))) => Some(names),
        (ObjectKind::Partition, Source::KvmStats(KvmStat::Vm(names))) => Some(names),
        _ => None,
    }
}

/// A KVM statistic's count since attach: the sum over `names` of each one's growth, `None`
/// when QEMU reports none of them now.
fn since_attach(names: &[&str], now: &StatValues, then: &StatValues) -> Option<u64> {
    let grown =
        names.iter().filter_map(|n| Some(now.get(*n)?.saturating_sub(then.get(*n).copied().unwrap_or(0))));
    grown.reduce(u64::saturating_add)
}

impl CounterSource for QmpStats {
    fn name(&self) -> &'static str {
        "qmp"
    }

    fn gives(&self) -> Gives {
        // A statistic QEMU did not report at attach has no baseline: its counter is not given.
        let Some(at) = &self.at_attach else { return Gives::NOTHING };
        let has = |kind: ObjectKind, names: &[&str]| match kind {
            ObjectKind::Partition => names.iter().any(|n| at.vm.contains_key(*n)),
            _ => names.iter().any(|n| at.vcpus.values().any(|v| v.contains_key(*n))),
        };
        let of =
            |kind| CounterSet::of_kind(kind, |c| stat_names(c, kind).is_some_and(|names| has(kind, names)));
        Gives { partition: of(ObjectKind::Partition), vp: of(ObjectKind::Vp) }
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        let Some((now, then)) = self.values(object) else { return };
        let kind = match object {
            Object::Partition => ObjectKind::Partition,
            Object::Vp(_) => ObjectKind::Vp,
        };
        for counter in catalog::counters_of(kind).filter(|c| only.contains(c.id)) {
            if let Some(v) = stat_names(counter, kind).and_then(|names| since_attach(names, now, then)) {
                page.set(counter.id, v);
            }
        }
    }

    fn unavailable(&self) -> Vec<String> {
        self.error.iter().cloned().collect()
    }
}

impl VmSource for QmpStats {
    fn read(&mut self, vm: &VmView<'_>) {
        self.qom_paths =
            vm.vcpus.iter().enumerate().filter_map(|(i, v)| Some((i as u32, v.qom_path.clone()?))).collect();
        if self.at_attach.is_none() {
            return;
        }
        let Some(q) = self.qmp.as_mut() else { return };
        match q.query_kvm_stats() {
            Ok(s) => self.now = s,
            Err(e) => {
                // QMP is gone: its counters stop being available rather than going stale.
                self.error = Some(hvstats::snapshot::error_chain(&e));
                self.qmp = None;
                self.at_attach = None;
                self.now = None;
            }
        }
    }

    fn vcpu_threads(&mut self) -> BTreeMap<u32, VcpuThread> {
        let Some(q) = self.qmp.as_mut() else { return BTreeMap::new() };
        match q.query_cpus() {
            Ok(cpus) => cpus
                .into_iter()
                .map(|c| (c.index, VcpuThread { tid: c.thread_id, qom_path: Some(c.qom_path) }))
                .collect(),
            Err(e) => {
                self.failed(&e);
                BTreeMap::new()
            }
        }
    }

    fn vm_name(&mut self) -> Option<String> {
        self.name.clone()
    }

    fn vm_uuid(&mut self) -> Option<hvstats::vmm::VmUuid> {
        self.uuid
    }

    fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn fds(&self) -> usize {
        usize::from(self.qmp.is_some())
    }
}
