//! KVM's statistics of a QEMU VM through its QMP socket (`query-stats`): every vCPU statistic
//! and VM statistic the catalog keys, mapped by [`kvm_stat_map`]: KVM's own whole-life values,
//! counted from the vCPU's creation.
//! QMP also says which thread runs each vCPU (`query-cpus-fast`) and the VM's name
//! (`query-name`), which the observer asks this source for.
//!
//! A peer out of step (late, lying, gone) is not asked again: its counters stop being available
//! rather than going stale.

use std::collections::BTreeMap;
use std::time::Duration;

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::counter_set::CounterSet;

use hvstats_abi::vm_sources::Origin;

use super::kvm_stat_map;
use super::vm_source::{VcpuThread, VmAttach, VmSource, VmView};
use crate::observe::attach::ObserveError;
use crate::observe::qmp::{KvmStatsReply, Qmp, QmpError};
use crate::sources::counter_source::{CounterSource, Gives, Object};

/// The deadline of one QMP exchange (the connect and greeting, or one command and its reply).
pub const QMP_TIMEOUT: Duration = Duration::from_secs(2);

/// A VM's QMP session and what it last said.
#[derive(Debug)]
pub struct QmpStats {
    qmp: Option<Qmp>,
    error: Option<String>,
    name: Option<String>,
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
                q.query_kvm_stats()
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
}

impl CounterSource for QmpStats {
    fn name(&self) -> &'static str {
        "qmp"
    }

    fn gives(&self) -> Gives {
        // KVM's statistics as QEMU last reported them (whole-life values), mapped as every source
        // of KVM's statistics maps them.
        let (Some(_), Some(last)) = (&self.at_attach, self.now.as_ref().or(self.at_attach.as_ref())) else {
            return Gives::NOTHING;
        };
        let vp = last
            .vcpus
            .values()
            .map(|v| kvm_stat_map::given_by(ObjectKind::Vp, v))
            .reduce(|a, b| a.intersection(&b));
        Gives {
            partition: kvm_stat_map::given_by(ObjectKind::Partition, &last.vm),
            vp: vp.unwrap_or_default(),
        }
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        let Some(now) = &self.now else { return };
        match object {
            Object::Partition => kvm_stat_map::write(ObjectKind::Partition, page, only, &now.vm),
            Object::Vp(index) => {
                let Some(values) = self.qom_paths.get(&index).and_then(|q| now.vcpus.get(q)) else { return };
                kvm_stat_map::write(ObjectKind::Vp, page, only, values);
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

    fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn fds(&self) -> usize {
        usize::from(self.qmp.is_some())
    }

    fn origin(&self) -> Origin {
        Origin::VcpuCreation
    }
}
