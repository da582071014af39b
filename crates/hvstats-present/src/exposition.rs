//! The `/metrics` text: one reading of every live instance, encoded as Prometheus/OpenMetrics
//! metric families by `prometheus-client`.
//!
//! The families and their units, scales and help texts come from [`crate::metrics`]; this module
//! only walks the objects of a reading and attaches labels. A VM's series carry what identifies
//! them across restarts: `vm` (its name) and `vp` (the VP index), and `intercept` inside the
//! intercept families; what changes when a publisher restarts (the publishing instance, the
//! partition id, the publisher's pid) is on one `hvstats_vm_info` series per VM, to join on `vm`.
//! Hypervisor series carry `publisher` (every instance has its own); logical processor series
//! carry `lp`/`cpu` and come once per host, from one publisher. No series has an `instance` label: Prometheus sets that one to the scrape target. Objects whose page could not be read have no
//! series in that scrape. Beyond a cap on the number of VPs exported one by one, the remaining
//! partitions export the sum of their VPs under `vp="all"`, so a huge host cannot flood
//! Prometheus with series.
//!
//! An instance that keeps values by name beside its pages (`hvstats observe --mshv`: the
//! Microsoft Hypervisor's counters the catalog has no place for) exports them as one generic
//! family, `hvstats_mshv_value{instance, object, lp|partition|vp, name}` (the raw value as the
//! hypervisor prints it), and is named by `hvstats_mshv_instance_info{instance, source="mshv"}`,
//! so its catalog series can be told apart by a join on `instance`. Those values are bounded as
//! VPs are: `--max-vps` objects' worth per scrape, the rest counted in
//! `hvstats_mshv_values_omitted`.

use std::fmt::Write;
use std::sync::Arc;

use crate::collectors::{Collector, PER_VM_UNLESS_DETAIL, Selection};
use crate::metrics::{BaseUnit, Family, Member, MetricKind, families, histogram_families};
use crate::sink::{Kind, Number, OpenMetrics, Sink};
use hvstats::snapshot::{InstanceSnapshot, ObjectReading, PartitionSnapshot, VpSnapshot};
use hvstats_abi::catalog::counters_of;
use hvstats_abi::histogram::Log2Histogram;
use hvstats_abi::vm_sources::{CountOrigins, SourceTable};
use hvstats_abi::vm_state::VmState;
use hvstats_abi::{Counter, ObjectKind, Presentation};

use crate::live::Reading;

/// The media type of the OpenMetrics reply (for clients that accept it, as Prometheus does).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The media type of the classic Prometheus text format (curl, `promtool check metrics`).
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// True when an `Accept` header value asks for OpenMetrics.
pub fn accepts_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|t| t.trim().starts_with("application/openmetrics-text"))
}

/// The OpenMetrics text in the classic Prometheus text format (0.0.4): a counter's HELP and TYPE
/// name its samples (`…_total`), and there is no `# UNIT`, `# EOF` or `_created` sample (which
/// that format would take for a series of its own). Other samples are unchanged.
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut classic = Classic::new(&mut out);
    let _ = classic.write_str(openmetrics).and_then(|()| classic.finish());
    out
}

/// [`to_classic`] as a writer: OpenMetrics text written to it reaches `out` in the classic
/// format, a line at a time (a family's HELP waits for its TYPE, which says whether it is a
/// counter); [`finish`](Self::finish) writes a last line without a newline.
pub struct Classic<W> {
    out: W,
    /// The unfinished line, then a HELP line waiting for its family's TYPE.
    line: String,
    help: Option<String>,
    /// The `_created` samples' name of the current counter or histogram family.
    created: Option<String>,
}

impl<W: Write> Classic<W> {
    /// A converter writing to `out`.
    pub fn new(out: W) -> Self {
        Self { out, line: String::new(), help: None, created: None }
    }

    /// The writer it writes to.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Writes what is still held.
    ///
    /// # Errors
    /// When `out` fails.
    pub fn finish(&mut self) -> std::fmt::Result {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.convert(&line)?;
        }
        match self.help.take() {
            Some(help) => self.meta("# HELP ", &help, false),
            None => Ok(()),
        }
    }

    fn meta(&mut self, prefix: &str, rest: &str, counter: bool) -> std::fmt::Result {
        let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
        let suffix = if counter { "_total" } else { "" };
        writeln!(self.out, "{prefix}{name}{suffix} {tail}")
    }

    fn convert(&mut self, line: &str) -> std::fmt::Result {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(help) = self.help.replace(rest.to_owned()) {
                self.meta("# HELP ", &help, false)?;
            }
            return Ok(());
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let counter = rest.ends_with(" counter");
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            self.created = matches!(kind, "counter" | "histogram").then(|| format!("{name}_created"));
            if let Some(help) = self.help.take() {
                let same = help.split(' ').next() == rest.split(' ').next();
                self.meta("# HELP ", &help, same && counter)?;
            }
            return self.meta("# TYPE ", rest, counter);
        }
        if let Some(help) = self.help.take() {
            self.meta("# HELP ", &help, false)?;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            return Ok(());
        }
        if let Some(created) = &self.created
            && line.strip_prefix(created.as_str()).is_some_and(|rest| rest.starts_with(['{', ' ']))
        {
            return Ok(());
        }
        self.out.write_str(line)?;
        self.out.write_char('\n')
    }
}

impl<W: Write> Write for Classic<W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut rest = s;
        while let Some((head, tail)) = rest.split_once('\n') {
            if self.line.is_empty() {
                self.convert(head)?;
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.push_str(head);
                self.convert(&line)?;
            }
            rest = tail;
        }
        self.line.push_str(rest);
        Ok(())
    }
}

/// The label naming the hvstats instance that publishes an object (not `instance`, which
/// Prometheus sets to the scrape target).
pub const PUBLISHER: &str = "publisher";

/// The `vp` label of a partition's summed VPs, past the cap.
pub const ALL_VPS: &str = "all";

/// VPs an exporter exports one by one per scrape unless told otherwise (`serve --max-vps`); the
/// VPs of partitions beyond it are exported as one sum per partition (`vp="all"`).
pub const DEFAULT_MAX_VPS: usize = 4096;

/// One scrape: a reading, the cap on VPs exported one by one and the collectors exported.
#[derive(Debug)]
pub struct Exposition {
    reading: Arc<Reading>,
    max_vps: usize,
    read_time: Option<std::time::Duration>,
    selection: Selection,
    /// The `vm` label of each partition in walk order, made once per scrape.
    vm_labels: Vec<String>,
    /// The `vp` label of VP index `i`, made once per scrape.
    vp_labels: Vec<String>,
    /// From when each partition's counters count, in walk order, read once per scrape: their
    /// series' `_created`.
    origins: Vec<Origins>,
}

/// A partition's [`CountOrigins`] and the source table that says which origin each counter has.
type Origins = (CountOrigins, Option<SourceTable>);

/// A series' labels, made on the stack: at most [`LabelSet::CAP`] pairs.
#[derive(Clone, Copy)]
struct LabelSet<'a> {
    pairs: [(&'a str, &'a str); LabelSet::CAP],
    len: usize,
}

impl<'a> LabelSet<'a> {
    const CAP: usize = 10;

    fn of(pairs: &[(&'a str, &'a str)]) -> Self {
        let mut set = Self { pairs: [("", ""); Self::CAP], len: 0 };
        for &(name, value) in pairs {
            set.push(name, value);
        }
        set
    }

    /// Adds a pair; the walk never makes more than [`Self::CAP`] (a pair past it is left out).
    fn push(&mut self, name: &'a str, value: &'a str) {
        if let Some(slot) = self.pairs.get_mut(self.len) {
            *slot = (name, value);
            self.len += 1;
        }
    }

    fn with(mut self, name: &'a str, value: &'a str) -> Self {
        self.push(name, value);
        self
    }

    fn as_slice(&self) -> &[(&'a str, &'a str)] {
        &self.pairs[..self.len]
    }
}

impl Exposition {
    /// The exposition of `reading` with every collector, exporting at most `max_vps` VPs one by
    /// one.
    pub fn new(reading: impl Into<Arc<Reading>>, max_vps: usize) -> Self {
        let reading = reading.into();
        let vm_labels = vm_labels(&reading);
        let most =
            reading.instances.iter().flat_map(|i| &i.partitions).flat_map(|p| &p.vps).map(|vp| vp.index);
        let vp_labels = (0..most.max().map_or(0, |m| m as usize + 1)).map(|i| i.to_string()).collect();
        let origins = reading
            .instances
            .iter()
            .flat_map(|i| &i.partitions)
            .map(|p| (p.origins(), p.sources()))
            .collect();
        Self { reading, max_vps, read_time: None, selection: Selection::all(), vm_labels, vp_labels, origins }
    }

    /// The same, exporting only the collectors of `selection`.
    #[must_use]
    pub fn collect(mut self, selection: Selection) -> Self {
        self.selection = selection;
        self
    }

    /// The same, saying that reading took `took` (`hvstats_scrape_duration_seconds`).
    #[must_use]
    pub fn read_in(mut self, took: std::time::Duration) -> Self {
        self.read_time = Some(took);
        self
    }

    /// The text, in the OpenMetrics format, `# EOF` included.
    ///
    /// # Errors
    /// Only when formatting fails (it writes to a `String`).
    pub fn encode(self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// The text, in the OpenMetrics format, written to `out` as it is made (a writer of chunks
    /// holds it without the copies of a growing `String`).
    ///
    /// # Errors
    /// When `out` fails.
    pub fn encode_into(self, out: &mut impl Write) -> std::fmt::Result {
        let mut sink = OpenMetrics::new(out);
        self.encode_to(&mut sink)
    }

    /// The exposition in the Prometheus protobuf format (length-delimited `MetricFamily`
    /// messages), every histogram a native one ([`crate::protobuf`]).
    pub fn encode_protobuf(self) -> Vec<u8> {
        let mut sink = crate::protobuf::Protobuf::default();
        // The protobuf sink does not fail.
        let _ = self.encode_to(&mut sink);
        sink.into_bytes()
    }

    /// For each partition in walk order, whether its VPs are exported one by one.
    fn per_vp(&self) -> Vec<bool> {
        let mut budget = self.max_vps;
        self.partitions()
            .map(|(_, p)| {
                let fits = p.vps.len() <= budget;
                if fits {
                    budget -= p.vps.len();
                }
                fits
            })
            .collect()
    }

    /// The instance whose LP pages are exported: one publishing the Microsoft Hypervisor's own
    /// LP counters when there is one, else the first whose LPs can be read. Every instance's LPs
    /// are the same processors, counted from the same cumulative sources.
    fn lp_source(&self) -> Option<&InstanceSnapshot> {
        let readable =
            |i: &&InstanceSnapshot| i.lps.iter().any(|lp| matches!(lp.reading, ObjectReading::Counters(_)));
        let instances = &self.reading.instances;
        instances
            .iter()
            .filter(readable)
            .find(|i| i.description.kind == "mshv")
            .or_else(|| instances.iter().find(readable))
    }

    fn partitions(&self) -> impl Iterator<Item = (&InstanceSnapshot, &PartitionSnapshot)> {
        self.reading.instances.iter().flat_map(|i| i.partitions.iter().map(move |p| (i, p)))
    }

    fn has_objects(&self, kind: ObjectKind) -> bool {
        let instances = &self.reading.instances;
        match kind {
            ObjectKind::Hypervisor => !instances.is_empty() || !self.reading.dead_observers.is_empty(),
            ObjectKind::LogicalProcessor => instances.iter().any(|i| !i.lps.is_empty()),
            ObjectKind::Partition => instances.iter().any(|i| !i.partitions.is_empty()),
            ObjectKind::Vp => instances.iter().flat_map(|i| &i.partitions).any(|p| !p.vps.is_empty()),
        }
    }

    fn vp_label(&self, index: u32) -> &str {
        self.vp_labels.get(index as usize).map_or("", String::as_str)
    }

    /// The series of `family` for the object of `reading`, labelled `labels`.
    fn sample(
        &self,
        family: &Family,
        labels: LabelSet<'_>,
        reading: &ObjectReading,
        sink: &mut dyn Sink,
    ) -> std::fmt::Result {
        self.sample_where(family, labels, reading, sink, None, |_| true)
    }

    /// [`Self::sample`] of the members `keep` chooses, a counter's series with its `_created`
    /// when `origins` (its partition's) says from when it counts.
    fn sample_where(
        &self,
        family: &Family,
        labels: LabelSet<'_>,
        reading: &ObjectReading,
        sink: &mut dyn Sink,
        origins: Option<&Origins>,
        keep: impl Fn(&Member) -> bool,
    ) -> std::fmt::Result {
        for member in family.members.iter().filter(|m| keep(m)) {
            let Some(raw) = value_of(reading, member.counter) else { continue };
            let mut labels = labels;
            for (label, value) in member.label.into_iter().chain(member.detail) {
                labels.push(label, value);
            }
            // A state is a state set: a series per state, 1 for the current one.
            if member.counter.presentation == Presentation::State {
                let now = VmState::from_code(raw);
                for state in VmState::ALL {
                    let labels = labels.with("state", state.label());
                    sink.sample(labels.as_slice(), Number::Signed(i64::from(state == now)))?;
                }
                continue;
            }
            sink.sample(labels.as_slice(), number(family, member, raw))?;
            if family.kind == MetricKind::Counter
                && let Some(at) = origins.and_then(|(o, table)| o.of(member.counter.id, table.as_ref()))
            {
                sink.created(labels.as_slice(), at)?;
            }
        }
        Ok(())
    }

    fn encode_family(&self, family: &Family, sink: &mut dyn Sink, per_vp: &[bool]) -> std::fmt::Result {
        match family.object {
            ObjectKind::Hypervisor => self.encode_hypervisors(family, sink),
            ObjectKind::LogicalProcessor => self.encode_lps(family, sink),
            ObjectKind::Partition | ObjectKind::Vp => self.encode_vm_objects(family, sink, per_vp),
        }
    }

    /// A hypervisor family: every publisher has a hypervisor page of its own (its partitions,
    /// its VPs), and its name tells them apart; an observer that died is no instance any more,
    /// and the reader says it is down.
    fn encode_hypervisors(&self, family: &Family, sink: &mut dyn Sink) -> std::fmt::Result {
        for instance in &self.reading.instances {
            let labels = LabelSet::of(&[(PUBLISHER, &instance.name)]);
            self.sample(family, labels, &instance.hypervisor, sink)?;
        }
        let up = hvstats_abi::catalog::hypervisor::OBSERVER_UP.counter();
        if let Some(up) = up.filter(|up| family.members.iter().any(|m| m.counter.id == up.id)) {
            let down = ObjectReading::Counters(vec![(up, 0)]);
            for name in &self.reading.dead_observers {
                // An observer expected and never seen has no name: no label.
                let labels = match name.is_empty() {
                    true => LabelSet::of(&[]),
                    false => LabelSet::of(&[(PUBLISHER, name)]),
                };
                self.sample(family, labels, &down, sink)?;
            }
        }
        Ok(())
    }

    /// A logical processor family: the logical processors are the host's, whoever publishes
    /// them, so once per host, from one publisher (see `lp_source`): a sum over a host counts
    /// each CPU once.
    fn encode_lps(&self, family: &Family, sink: &mut dyn Sink) -> std::fmt::Result {
        for lp in self.lp_source().map(|i| i.lps.as_slice()).unwrap_or_default() {
            let (index, cpu) = (lp.index.to_string(), lp.cpu.to_string());
            let labels = LabelSet::of(&[("lp", &index), ("cpu", &cpu)]);
            self.sample(family, labels, &lp.reading, sink)?;
        }
        Ok(())
    }

    /// A partition or VP family: each VM's, its VPs one by one (`per_vp`) or summed.
    fn encode_vm_objects(&self, family: &Family, sink: &mut dyn Sink, per_vp: &[bool]) -> std::fmt::Result {
        // The intercept time of the essential set is the VM's unless VP detail is asked for (but
        // for the time halted, which is each VP's).
        let by_vm = family.object == ObjectKind::Vp
            && !self.selection.has(Collector::VpDetail)
            && family.exposed_name() == PER_VM_UNLESS_DETAIL;
        let partitions = self.partitions().zip(&self.vm_labels).zip(per_vp).zip(&self.origins);
        for ((((_, partition), vm), one_by_one), origins) in partitions {
            let labels = LabelSet::of(&[("vm", vm)]);
            let at = self.selection.has(Collector::Created).then_some(origins);
            if family.object == ObjectKind::Partition {
                self.sample_where(family, labels, &partition.reading, sink, at, |_| true)?;
            } else if *one_by_one && !by_vm {
                for vp in &partition.vps {
                    let labels = labels.with("vp", self.vp_label(vp.index));
                    self.sample_where(family, labels, &vp.reading, sink, at, |_| true)?;
                }
            } else if *one_by_one {
                // The time halted stays each VP's (a VP halted throughout is 1 s/s of its own,
                // never added to another's); the handling times are the VM's.
                let halted = |m: &Member| m.counter.is_time_halted();
                for vp in &partition.vps {
                    let labels = labels.with("vp", self.vp_label(vp.index));
                    self.sample_where(family, labels, &vp.reading, sink, at, halted)?;
                }
                if let Some(sum) = partition.vps_summed() {
                    self.sample_where(family, labels.with("vp", ALL_VPS), &sum, sink, at, |m| !halted(m))?;
                }
            } else if let Some(sum) = partition.vps_summed() {
                self.sample_where(family, labels.with("vp", ALL_VPS), &sum, sink, at, |_| true)?;
            }
        }
        Ok(())
    }

    /// Each VP's histogram of `family` (a partition's VPs summed bucket by bucket past the cap,
    /// or when only each VM's are asked for).
    fn encode_histograms(&self, family: &Family, sink: &mut dyn Sink, per_vp: &[bool]) -> std::fmt::Result {
        let Some(member) = family.members.first() else { return Ok(()) };
        let id = member.counter.id;
        let by_vm = !self.selection.has(Collector::Histograms);
        let of = |vp: &VpSnapshot| vp.histograms.iter().find(|(c, _)| c.id == id).map(|(_, h)| *h);
        let partitions = self.partitions().zip(&self.vm_labels).zip(per_vp).zip(&self.origins);
        for ((((_, partition), vm), one_by_one), (origins, table)) in partitions {
            let labels = LabelSet::of(&[("vm", vm)]);
            let created = origins.of(id, table.as_ref()).filter(|_| self.selection.has(Collector::Created));
            if *one_by_one && !by_vm {
                for vp in &partition.vps {
                    let Some(h) = of(vp) else { continue };
                    let labels = labels.with("vp", self.vp_label(vp.index));
                    sink.histogram(labels.as_slice(), &h)?;
                    if let Some(at) = created {
                        sink.created(labels.as_slice(), at)?;
                    }
                }
            } else {
                let mut sum: Option<Log2Histogram> = None;
                for h in partition.vps.iter().filter_map(of) {
                    let total = sum.get_or_insert_with(Log2Histogram::default);
                    total.sum_ns = total.sum_ns.wrapping_add(h.sum_ns);
                    for (t, b) in total.buckets.iter_mut().zip(h.buckets) {
                        *t = t.wrapping_add(b);
                    }
                }
                if let Some(h) = sum {
                    let labels = labels.with("vp", ALL_VPS);
                    sink.histogram(labels.as_slice(), &h)?;
                    if let Some(at) = created {
                        sink.created(labels.as_slice(), at)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The value of `counter` in `reading`. Readings list their counters in catalog order, so it is
/// found at its catalog position unless the publisher left an earlier counter out; then by a scan.
pub fn value_of(reading: &ObjectReading, counter: &Counter) -> Option<u64> {
    let ObjectReading::Counters(values) = reading else { return None };
    let position = catalog_position(counter);
    match values.get(position) {
        Some((c, v)) if c.id == counter.id => Some(*v),
        _ => values.iter().find(|(c, _)| c.id == counter.id).map(|(_, v)| *v),
    }
}

/// The position of `counter` among the counters of its kind (page order).
fn catalog_position(counter: &Counter) -> usize {
    use std::sync::OnceLock;
    static POSITIONS: OnceLock<std::collections::HashMap<hvstats_abi::CounterId, usize>> = OnceLock::new();
    let positions = POSITIONS.get_or_init(|| {
        ObjectKind::ALL.iter().flat_map(|k| counters_of(*k).enumerate().map(|(i, c)| (c.id, i))).collect()
    });
    positions.get(&counter.id).copied().unwrap_or(usize::MAX)
}

/// A raw page value as the family exports it. Whole counts stay integers: an f64 would round
/// counts above 2^53.
fn number(family: &Family, member: &Member, raw: u64) -> Number {
    let _ = family;
    match member.exact(raw) {
        Some(v) => Number::Whole(v),
        None => Number::Real(member.value(raw)),
    }
}

impl Exposition {
    /// The exporter's own families: what it is, what it could read and how long that took.
    fn encode_exporter(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        if !self.selection.has(Collector::Exporter) {
            return Ok(());
        }
        sink.family("build_info", "The hvstats build serving these metrics (always 1).", None, Kind::Gauge)?;
        sink.sample(&[("version", env!("CARGO_PKG_VERSION"))], Number::Signed(1))?;
        sink.family(
            "read_errors",
            "What this scrape could not read: instances that could not be attached (or the runtime \
             directory itself) and pages that could not be read.",
            None,
            Kind::Gauge,
        )?;
        sink.sample(&[], Number::Signed(read_errors(&self.reading) as i64))?;
        if let Some(took) = self.read_time {
            sink.family(
                "scrape_duration",
                "Time this scrape took to read every instance.",
                Some(BaseUnit::Seconds),
                Kind::Gauge,
            )?;
            sink.sample(&[], Number::Real(took.as_secs_f64()))?;
        }
        if self.reading.instances.is_empty() && self.reading.failed.is_empty() {
            return Ok(());
        }
        sink.family(
            "instance_up",
            "1 for each instance this scrape read, 0 for one it found but could not attach.",
            None,
            Kind::Gauge,
        )?;
        for instance in &self.reading.instances {
            let up = i64::from(!matches!(instance.hypervisor, ObjectReading::Unreadable { .. }));
            sink.sample(&[(PUBLISHER, &instance.name)], Number::Signed(up))?;
        }
        for name in &self.reading.failed {
            sink.sample(&[(PUBLISHER, name)], Number::Signed(0))?;
        }
        Ok(())
    }

    /// Each VM's liveness, identity and sources.
    fn encode_vms(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        if !self.selection.has(Collector::Vm) || !self.has_objects(ObjectKind::Partition) {
            return Ok(());
        }
        self.encode_vm_up(sink)?;
        self.encode_vm_info(sink)?;
        self.encode_counting_since(sink)?;
        self.encode_source_up(sink)
    }

    fn encode_vm_up(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        sink.family(
            "vm_up",
            "1 for each partition (VM) that runs or is paused and whose counters this scrape read; \
             0 for one that stopped, shut down or is stuck on an internal error.",
            None,
            Kind::Gauge,
        )?;
        for ((_, partition), vm) in self.partitions().zip(&self.vm_labels) {
            let read = matches!(partition.reading, ObjectReading::Counters(_));
            let state = partition.reading.get(VM_STATE).map(VmState::from_code);
            let gone = matches!(state, Some(VmState::Shutdown | VmState::InternalError));
            sink.sample(&[("vm", vm)], Number::Signed(i64::from(partition.active && read && !gone)))?;
        }
        Ok(())
    }

    fn encode_vm_info(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        sink.family(
            "vm_info",
            "Each VM (partition) this scrape read: its publishing instance (hvstats' own, or the \
             observer of other processes' VMs), the publisher's pid and kind, the partition id \
             in it, and for an observed VM its VMM, the VMM's pid, the VM's UUID when the VMM \
             has one, for a QEMU VM its Hyper-V enlightenments (the hv-* features of its -cpu, \
             none when it has none), and, where the platform that runs it says who it is (not \
             the VMM alone), the platform, what said it (identity_source) and the platform's \
             labels (OpenStack: instance_name, project_name, flavor_name, ...; KubeVirt: \
             namespace, name, pod_uid; Proxmox VE: vmid, id, name, tags).",
            None,
            Kind::Gauge,
        )?;
        for ((instance, partition), vm) in self.partitions().zip(&self.vm_labels) {
            let (pid, id) = (instance.pid.to_string(), partition.id.to_string());
            let vmm_pid = partition.vmm.map(|vmm| vmm.pid.to_string());
            let uuid = partition.uuid.map(|u| u.to_string());
            // Known for a QEMU VM: its hv-* features, "none" when it has none.
            let hyperv = hvstats_abi::hyperv_features::names(partition.hyperv_enlightenments).map(|n| {
                let list = n.collect::<Vec<_>>().join(",");
                if list.is_empty() { "none".to_owned() } else { list }
            });
            let mut labels = vec![
                ("vm", vm.as_str()),
                (PUBLISHER, &instance.name),
                ("publisher_pid", &pid),
                ("publisher_kind", &instance.description.kind),
                ("partition", &id),
            ];
            if let (Some(vmm), Some(vmm_pid)) = (partition.vmm, &vmm_pid) {
                labels.extend([("vmm", vmm.vmm.name()), ("vmm_pid", vmm_pid)]);
            }
            labels.extend(uuid.as_deref().map(|u| ("uuid", u)));
            labels.extend(hyperv.as_deref().map(|h| ("hyperv_enlightenments", h)));
            if let Some(platform) = self.reading.platform(&instance.name, partition.id) {
                labels.extend([
                    ("platform", platform.platform.as_str()),
                    ("identity_source", &platform.source),
                ]);
                labels.extend(platform.labels.iter().map(|(name, value)| (*name, value.as_str())));
            }
            sink.sample(&labels, Number::Signed(1))?;
        }
        Ok(())
    }

    fn encode_counting_since(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        sink.family(
            "vm_counting_since",
            "When the publisher began counting each VM's counters (an observer: attached to it), \
             in seconds since the Unix epoch: a new value is a new origin, from which every \
             counter counted from attach (not from the vCPU's creation, nor kept in the kernel \
             across observers: vm_source_up, snapshot --json's sources) starts again at 0. A \
             reset said, not a count lost without a word.",
            Some(BaseUnit::Seconds),
            Kind::Gauge,
        )?;
        for ((origins, _), vm) in self.origins.iter().zip(&self.vm_labels) {
            if let Some(us) = origins.counting_since_us {
                sink.sample(&[("vm", vm)], Number::Real(us as f64 / 1e6))?;
            }
        }
        Ok(())
    }

    fn encode_source_up(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        let tables: Vec<_> = self.partitions().map(|(_, p)| p.sources()).collect();
        if !tables.iter().any(Option::is_some) {
            return Ok(());
        }
        sink.family(
            "vm_source_up",
            "For each source of an observed VM's counters (the VMM's KVM statistics \
             descriptors, libvirt, QMP, tracepoints, its threads' files), 1 while it gives \
             counters, 0 while it is there but gives none (its peer failed or stalled).",
            None,
            Kind::Gauge,
        )?;
        for (table, vm) in tables.iter().zip(&self.vm_labels) {
            for source in table.iter().flat_map(|t| t.sources()) {
                sink.sample(&[("vm", vm), ("source", source.name())], Number::Signed(i64::from(source.up)))?;
            }
        }
        Ok(())
    }
}

/// The catalog name of a VM's run state.
const VM_STATE: &str = "VM state";

/// The `vm` label of each partition of `reading` in walk order: its name, which its publisher
/// keeps across restarts (an unnamed partition is `partition-<id>`), with characters that cannot
/// be seen shown escaped ([`crate::text::Escaped`]: a lookalike with a zero-width space is not the
/// name it imitates). No label holds a pid or an instance name, which change with every process:
/// a name two partitions share stays with the senior one (its publisher started first, and
/// within a publisher the lower partition id: an observer numbers VMs as they attach, oldest VMM
/// first), and the others get `#2`, `#3`, … in that order, so a VMM that takes the name of a
/// running VM cannot take its series, and no two series collide.
fn vm_labels(reading: &Reading) -> Vec<String> {
    use std::collections::HashSet;
    let partitions: Vec<_> =
        reading.instances.iter().flat_map(|i| i.partitions.iter().map(move |p| (i, p))).collect();
    let names: Vec<String> = partitions
        .iter()
        .map(|(_, p)| match p.name.is_empty() {
            true => format!("partition-{}", p.id),
            false => crate::text::escaped(&p.name),
        })
        .collect();
    let seniority = |k: usize| {
        let (instance, partition) = partitions[k];
        let publisher = hvstats::publish::InstanceName::parse(&instance.name).map(|n| (n.start_time, n.seq));
        (publisher.is_none(), publisher, partition.id)
    };
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|&k| seniority(k));
    // The senior partition of a name keeps it; a suffixed label never takes a name some
    // partition has.
    let taken: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut first = HashSet::new();
    let mut suffixed = HashSet::new();
    let mut labels = vec![String::new(); names.len()];
    for k in order {
        let name = &names[k];
        labels[k] = if first.insert(name.as_str()) {
            name.clone()
        } else {
            (2..)
                .map(|n| format!("{name}#{n}"))
                .find(|label| !taken.contains(label.as_str()) && suffixed.insert(label.clone()))
                .unwrap_or_default()
        };
    }
    labels
}

/// What `reading` could not read: its problems and its unreadable pages.
pub fn read_errors(reading: &Reading) -> usize {
    let unreadable = |r: &ObjectReading| usize::from(matches!(r, ObjectReading::Unreadable { .. }));
    let pages: usize = reading
        .instances
        .iter()
        .map(|i| {
            unreadable(&i.hypervisor)
                + i.lps.iter().map(|lp| unreadable(&lp.reading)).sum::<usize>()
                + i.partitions
                    .iter()
                    .map(|p| {
                        unreadable(&p.reading) + p.vps.iter().map(|vp| unreadable(&vp.reading)).sum::<usize>()
                    })
                    .sum::<usize>()
        })
        .sum();
    reading.problems.len() + pages
}

/// True when something was to be read and nothing could be: every instance failed to attach (or
/// the runtime directory could not be read), or every page of those attached was unreadable.
pub fn nothing_read(reading: &Reading) -> bool {
    let readable = |r: &ObjectReading| matches!(r, ObjectReading::Counters(_));
    let something = reading.instances.iter().any(|i| {
        readable(&i.hypervisor)
            || i.lps.iter().any(|lp| readable(&lp.reading))
            || i.partitions
                .iter()
                .any(|p| readable(&p.reading) || p.vps.iter().any(|vp| readable(&vp.reading)))
    });
    !something && read_errors(reading) > 0
}

impl Exposition {
    /// Every family of the collectors selected, into `sink`.
    fn encode_to(&self, sink: &mut dyn Sink) -> std::fmt::Result {
        self.encode_exporter(sink)?;
        self.encode_vms(sink)?;
        let per_vp = self.per_vp();
        for family in families() {
            if !self.has_objects(family.object) || !self.selection.exports(family) {
                continue;
            }
            let kind = match family.kind {
                MetricKind::Counter => Kind::Counter,
                MetricKind::Gauge => Kind::Gauge,
            };
            sink.family(&family.name, &family.help, family.unit, kind)?;
            self.encode_family(family, sink, &per_vp)?;
        }
        if self.selection.has(Collector::Mshv) && self.reading.instances.iter().any(|i| i.unmapped.is_some())
        {
            self.encode_mshv(sink, &per_vp)?;
        }
        let histograms =
            self.selection.has(Collector::Histograms) || self.selection.has(Collector::HistogramsVm);
        if histograms && self.has_objects(ObjectKind::Vp) {
            for family in histogram_families() {
                sink.family(&family.name, &family.help, Some(BaseUnit::Seconds), Kind::Histogram)?;
                self.encode_histograms(family, sink, &per_vp)?;
            }
        }
        sink.finish()
    }
}

/// The help of the generic family of values the catalog has no counter for.
const MSHV_VALUE_HELP: &str = "A counter of the Microsoft Hypervisor the catalog has no counter for, by the name Linux's \
     mshv debugfs prints: the raw value (times in 100 ns units)";

/// The help of the count of such values left out of a scrape.
const MSHV_OMITTED_HELP: &str = "Values of hvstats_mshv_value this scrape left out: those of LPs, partitions and VPs \
     past --max-vps objects exported one by one, and of VPs summed under vp=\"all\"";

/// Whether an object's unmapped values are exported.
#[derive(Clone, Copy)]
enum Shown {
    /// Always (a hypervisor's).
    Always,
    /// While the budget of `--max-vps` objects has room (LPs, partitions, VPs exported one by one).
    WithinBudget,
    /// Never (VPs summed under `vp="all"`): counted as left out.
    Never,
}

/// The unmapped values of one scrape as they are exported: the objects the budget has room for
/// still, and per publisher the values left out.
struct MshvValues {
    budget: usize,
    omitted: std::collections::BTreeMap<String, u64>,
}

impl MshvValues {
    /// Exports `values` under `base` when `shown` lets it; else counts them as left out.
    fn emit(
        &mut self,
        sink: &mut dyn Sink,
        publisher: &str,
        base: LabelSet<'_>,
        values: Option<&Vec<(String, u64)>>,
        shown: Shown,
    ) -> std::fmt::Result {
        let Some(values) = values.filter(|v| !v.is_empty()) else { return Ok(()) };
        match shown {
            Shown::Always => {}
            Shown::WithinBudget if self.budget > 0 => self.budget -= 1,
            Shown::WithinBudget | Shown::Never => {
                *self.omitted.entry(publisher.to_owned()).or_default() += values.len() as u64;
                return Ok(());
            }
        }
        for (name, value) in values {
            sink.sample(base.with("name", name).as_slice(), Number::Whole(*value))?;
        }
        Ok(())
    }
}

impl Exposition {
    /// `mshv_instance_info`, `mshv_value` and `mshv_values_omitted` for the instances that keep
    /// unmapped values. Besides each hypervisor's, the values of at most `--max-vps` objects (LPs,
    /// partitions and VPs alike, in that order) are exported, and a partition's VPs only when they
    /// are exported one by one (under the VP cap); what is left out is counted, per instance.
    fn encode_mshv(&self, sink: &mut dyn Sink, per_vp: &[bool]) -> std::fmt::Result {
        let help = "An instance publishing the Microsoft Hypervisor's own counters (hvstats observe --mshv)";
        sink.family("mshv_instance_info", help, None, Kind::Gauge)?;
        for instance in self.mshv_instances() {
            let labels = [
                ("publisher", instance.name.as_str()),
                ("source", "mshv"),
                ("description", &instance.description.name),
            ];
            sink.sample(&labels, Number::Whole(1))?;
        }
        let omitted = self.mshv_instances().map(|i| (i.name.clone(), 0)).collect();
        let mut values = MshvValues { budget: self.max_vps, omitted };
        sink.family("mshv_value", MSHV_VALUE_HELP, None, Kind::Gauge)?;
        self.encode_mshv_globals(sink, &mut values)?;
        self.encode_mshv_partitions(sink, per_vp, &mut values)?;
        sink.family("mshv_values_omitted", MSHV_OMITTED_HELP, None, Kind::Gauge)?;
        for (publisher, count) in values.omitted {
            sink.sample(&[("publisher", &publisher)], Number::Whole(count))?;
        }
        Ok(())
    }

    /// The instances that keep unmapped values.
    fn mshv_instances(&self) -> impl Iterator<Item = &InstanceSnapshot> {
        self.reading.instances.iter().filter(|i| i.unmapped.is_some())
    }

    /// Each hypervisor's unmapped values, then its LPs'.
    fn encode_mshv_globals(&self, sink: &mut dyn Sink, values: &mut MshvValues) -> std::fmt::Result {
        use hvstats::unmapped::ObjectRef;
        for instance in self.mshv_instances() {
            let Some(unmapped) = &instance.unmapped else { continue };
            let publisher = instance.name.as_str();
            let base = |object| LabelSet::of(&[("publisher", publisher), ("object", object)]);
            values.emit(
                sink,
                publisher,
                base("hypervisor"),
                unmapped.get(&ObjectRef::Hypervisor),
                Shown::Always,
            )?;
            for lp in &instance.lps {
                let index = lp.index.to_string();
                let labels = base("lp").with("lp", &index);
                values.emit(
                    sink,
                    publisher,
                    labels,
                    unmapped.get(&ObjectRef::Lp(lp.index)),
                    Shown::WithinBudget,
                )?;
            }
        }
        Ok(())
    }

    /// Each partition's unmapped values, and its VPs' when they are exported one by one.
    fn encode_mshv_partitions(
        &self,
        sink: &mut dyn Sink,
        per_vp: &[bool],
        values: &mut MshvValues,
    ) -> std::fmt::Result {
        use hvstats::unmapped::ObjectRef;
        for ((instance, partition), one_by_one) in self.partitions().zip(per_vp) {
            let Some(unmapped) = &instance.unmapped else { continue };
            let publisher = instance.name.as_str();
            let id = partition.id.to_string();
            let base =
                |object| LabelSet::of(&[("publisher", publisher), ("object", object), ("partition", &id)]);
            let own = unmapped.get(&ObjectRef::Partition(partition.id));
            values.emit(sink, publisher, base("partition"), own, Shown::WithinBudget)?;
            let shown = if *one_by_one { Shown::WithinBudget } else { Shown::Never };
            for vp in &partition.vps {
                let labels = base("vp").with("vp", self.vp_label(vp.index));
                values.emit(
                    sink,
                    publisher,
                    labels,
                    unmapped.get(&ObjectRef::Vp(partition.id, vp.index)),
                    shown,
                )?;
            }
        }
        Ok(())
    }
}

/// A text summary for `/healthz` and whether it is healthy: `ok` with the instance count, or
/// `unhealthy` when nothing could be read ([`nothing_read`]); then what could not be read.
pub fn health(reading: &Reading) -> (bool, String) {
    let healthy = !nothing_read(reading);
    (
        healthy,
        crate::live::health_text(healthy, reading.instances.len(), reading.vp_count(), &reading.problems),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectors::{Collector, Selection};
    use hvstats_testkit::synthetic_instance;

    fn lines_of<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn a_vm_its_platform_names_carries_the_platforms_labels_on_vm_info_only() {
        let instance = synthetic_instance(2, 1);
        let mut reading = crate::live::Reading::of(vec![instance]);
        let written = "1\tplatform\topenstack\n1\tsource\tlibvirt-metadata\n\
            1\tlabel.instance_name\tweb \"1\"\n1\tlabel.project_name\tshop\n";
        let platforms = hvstats_platform::shown::decode(written);
        reading.platforms.insert("4242-1-0".to_owned(), platforms);
        let text = Exposition::new(reading, 4).encode().unwrap();
        let info = lines_of(&text, "hvstats_vm_info{");
        assert_eq!(info.len(), 2, "{text}");
        let first = info.iter().find(|l| l.contains("partition=\"1\"")).unwrap();
        for label in [
            "platform=\"openstack\"",
            "identity_source=\"libvirt-metadata\"",
            "instance_name=\"web \\\"1\\\"\"",
            "project_name=\"shop\"",
        ] {
            assert!(first.contains(label), "{label} not in {first}");
        }
        let second = info.iter().find(|l| l.contains("partition=\"2\"")).unwrap();
        assert!(!second.contains("platform="), "{second}");
        // Never on a counter's series: cardinality stays the VMs'.
        let series = text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("hvstats_vm_info{"));
        assert!(!series.clone().any(|l| l.contains("project_name")), "{text}");
    }

    #[test]
    fn each_source_of_an_observed_vm_is_a_source_up_series_and_snapshot_json_names_its_counters() {
        use hvstats::snapshot::ObjectReading;
        use hvstats_abi::catalog::vp;
        use hvstats_abi::vm_sources::{Origin, SourceEntry, SourceTable};
        let mut instance = synthetic_instance(1, 1);
        let mut table = SourceTable::default();
        let libvirt = table.push(SourceEntry::new("libvirt", true, Origin::VcpuCreation)).unwrap();
        table.push(SourceEntry::new("qmp", false, Origin::VcpuCreation)).unwrap();
        table.set_writer(vp::HLT_INSTRUCTIONS, libvirt);
        let partition = &mut instance.partitions[0];
        partition.name = "vm-a".into();
        let rows: Vec<_> = table.rows().collect();
        let ObjectReading::Counters(values) = &mut partition.reading else { panic!() };
        for (c, v) in values.iter_mut() {
            if let Some((_, w)) = rows.iter().find(|(id, _)| *id == c.id) {
                *v = *w;
            }
        }
        let json = crate::snapshot_json::partition_json(&instance.partitions[0], None, &instance);
        assert_eq!(json["sources"][0]["name"], "libvirt");
        assert_eq!(json["sources"][0]["counts_from"], "vcpu-creation");
        assert_eq!(json["sources"][0]["vp"], serde_json::json!(["HLT instructions/sec"]));
        assert_eq!(json["sources"][1]["up"], false);
        let text = Exposition::new(crate::live::Reading::of(vec![instance]), 4).encode().unwrap();
        let up = lines_of(&text, "hvstats_vm_source_up{");
        assert_eq!(
            up,
            [
                "hvstats_vm_source_up{vm=\"vm-a\",source=\"libvirt\"} 1",
                "hvstats_vm_source_up{vm=\"vm-a\",source=\"qmp\"} 0"
            ]
        );
    }

    /// A VM `name` of one VP whose two sources, of `origins`, write the VP's I/O instructions and
    /// hypercalls; its page says `rows` (origin times) beside the sources' rows.
    fn vm_of_two_sources(
        name: &str,
        origins: [(&str, hvstats_abi::vm_sources::Origin); 2],
        rows: &[(hvstats_abi::CounterId, u64)],
    ) -> hvstats::snapshot::InstanceSnapshot {
        use hvstats::snapshot::ObjectReading;
        use hvstats_abi::catalog::vp;
        use hvstats_abi::vm_sources::{SourceEntry, SourceTable};
        let mut instance = synthetic_instance(1, 1);
        let mut table = SourceTable::default();
        for ((source, origin), counter) in origins.into_iter().zip([vp::IO_INSTRUCTIONS, vp::HYPERCALLS]) {
            let number = table.push(SourceEntry::new(source, true, origin)).unwrap();
            table.set_writer(counter, number);
        }
        let p = &mut instance.partitions[0];
        p.name = name.into();
        let rows: Vec<_> = table.rows().chain(rows.iter().copied()).collect();
        let ObjectReading::Counters(values) = &mut p.reading else { panic!() };
        for (c, v) in values.iter_mut() {
            if let Some((_, w)) = rows.iter().find(|(id, _)| *id == c.id) {
                *v = *w;
            }
        }
        instance
    }

    #[test]
    fn each_counter_says_from_when_it_counts_and_a_reset_is_a_new_origin() {
        use hvstats_abi::catalog::partition;
        use hvstats_abi::vm_sources::Origin;
        // Attached at 1764290000.25 s; the VM's process started 100 s before.
        let instance = vm_of_two_sources(
            "vm-a",
            [("tracepoints", Origin::Attach), ("qmp", Origin::VcpuCreation)],
            &[
                (partition::COUNTING_SINCE, 1_764_290_000_250_000),
                (partition::VM_STARTED, 1_764_289_900_000_000),
            ],
        );
        let reading = crate::live::Reading::of(vec![instance.clone()]);
        let default = Exposition::new(reading.clone(), 4).collect(Selection::defaults()).encode().unwrap();
        assert!(!default.contains("_created"), "_created only when asked: {default}");
        assert_eq!(
            lines_of(&default, "hvstats_vm_counting_since_seconds{"),
            ["hvstats_vm_counting_since_seconds{vm=\"vm-a\"} 1764290000.25"]
        );
        let selection = Selection::defaults().with(Collector::Created);
        let text = Exposition::new(reading, 4).collect(selection).encode().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let after = |total: &str| {
            let at = lines.iter().position(|l| l.starts_with(total)).unwrap_or_else(|| panic!("no {total}"));
            lines[at + 1]
        };
        // Counted since attach: a new observer starts it again, and says so.
        assert_eq!(
            after("hvstats_vp_intercepts_total{vm=\"vm-a\",vp=\"0\",intercept=\"io\"}"),
            "hvstats_vp_intercepts_created{vm=\"vm-a\",vp=\"0\",intercept=\"io\"} 1764290000.250000"
        );
        // Counted by KVM since the vCPU's creation: it outlives the observer.
        assert_eq!(
            after("hvstats_vp_hypercalls_total{vm=\"vm-a\",vp=\"0\"}"),
            "hvstats_vp_hypercalls_created{vm=\"vm-a\",vp=\"0\"} 1764289900.000000"
        );
        // Every counter series has its `_created`; no gauge has one.
        let totals = text.lines().filter(|l| l.contains("_total{vm=")).count();
        let created = text.lines().filter(|l| l.contains("_created{vm=")).count();
        assert_eq!(totals, created, "{text}");
        let json = crate::snapshot_json::partition_json(&instance.partitions[0], None, &instance);
        assert_eq!(json["counting_since"], 1_764_290_000.25);
        assert_eq!(json["sources"][0]["counts_since"], 1_764_290_000.25);
        assert_eq!(json["sources"][1]["counts_since"], 1_764_289_900.0);
    }

    #[test]
    fn a_counter_whose_counts_are_kept_says_the_first_attach_in_every_format() {
        use hvstats_abi::catalog::partition;
        use hvstats_abi::vm_sources::Origin;
        // This observer attached at 1764290000.25 s; the counts it continues were begun by the
        // first observer, 60.5 s before.
        let instance = vm_of_two_sources(
            "vm-k",
            [("tracepoints", Origin::Kept), ("thread-clock", Origin::Attach)],
            &[
                (partition::COUNTING_SINCE, 1_764_290_000_250_000),
                (partition::VM_STARTED, 1_764_289_900_000_000),
                (partition::KEPT_SINCE, 1_764_289_939_750_000),
            ],
        );
        let reading = crate::live::Reading::of(vec![instance.clone()]);
        let selection = Selection::defaults().with(Collector::Created);
        let text = Exposition::new(reading.clone(), 4).collect(selection).encode().unwrap();
        assert_eq!(
            lines_of(&text, "hvstats_vp_intercepts_created{vm=\"vm-k\",vp=\"0\",intercept=\"io\"}"),
            ["hvstats_vp_intercepts_created{vm=\"vm-k\",vp=\"0\",intercept=\"io\"} 1764289939.750000"]
        );
        assert_eq!(
            lines_of(&text, "hvstats_vp_hypercalls_created{vm=\"vm-k\",vp=\"0\"}"),
            ["hvstats_vp_hypercalls_created{vm=\"vm-k\",vp=\"0\"} 1764290000.250000"],
            "a source counting from attach still says this observer's attach"
        );
        // The page's own origin stays this observer's attach.
        assert_eq!(
            lines_of(&text, "hvstats_vm_counting_since_seconds{"),
            ["hvstats_vm_counting_since_seconds{vm=\"vm-k\"} 1764290000.25"]
        );
        let families =
            crate::protobuf::decode(&Exposition::new(reading, 4).collect(selection).encode_protobuf())
                .unwrap();
        let intercepts =
            families.iter().find(|f| f.name.as_deref() == Some("hvstats_vp_intercepts_total")).unwrap();
        let io = intercepts
            .metric
            .iter()
            .find(|m| {
                m.label
                    .iter()
                    .any(|l| l.name.as_deref() == Some("intercept") && l.value.as_deref() == Some("io"))
            })
            .unwrap();
        let at = io.counter.as_ref().and_then(|c| c.created_timestamp.clone()).unwrap();
        assert_eq!((at.seconds, at.nanos), (Some(1_764_289_939), Some(750_000_000)));
        let json = crate::snapshot_json::partition_json(&instance.partitions[0], None, &instance);
        assert_eq!(json["counting_since"], 1_764_290_000.25);
        assert_eq!(json["kept_since"], 1_764_289_939.75);
        assert_eq!(json["sources"][0]["counts_from"], "kept");
        assert_eq!(json["sources"][0]["counts_since"], 1_764_289_939.75);
        assert_eq!(json["sources"][1]["counts_since"], 1_764_290_000.25);
        // The streamed document (snapshot --json of a whole host) says the same.
        let mut out = Vec::new();
        crate::snapshot_json::write_instances(std::slice::from_ref(&instance), &mut out).unwrap();
        let streamed: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let partition = &streamed["instances"][0]["partitions"][0];
        assert_eq!(partition["kept_since"], 1_764_289_939.75, "{partition}");
        assert_eq!(partition["sources"][0]["counts_since"], 1_764_289_939.75);
    }

    #[test]
    fn every_vp_is_a_series_under_the_cap_and_partition_sums_beyond_it() {
        // 3 partitions of 2 VPs; VP `i` of partition `p` holds 1000 × (2p + i) + its page index.
        let text =
            Exposition::new(crate::live::Reading::of(vec![synthetic_instance(3, 2)]), 4).encode().unwrap();
        let hypercalls = lines_of(&text, "hvstats_vp_hypercalls_total{");
        // Partitions 1 and 2 fit in 4 VPs; partition 3 is summed.
        assert_eq!(hypercalls.len(), 5, "{text}");
        let index = hvstats_abi::catalog::counters_of(ObjectKind::Vp)
            .position(|c| c.id == hvstats_abi::catalog::vp::HYPERCALLS)
            .unwrap() as u64;
        let all = hypercalls.iter().find(|l| l.contains("vp=\"all\"")).unwrap();
        assert!(all.contains("vm=\"partition-3\""), "{all}");
        assert!(all.ends_with(&format!(" {}", 4000 + index + 5000 + index)), "{all}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn an_observed_vms_synthetic_interrupts_and_flushes_are_series_and_our_own_partitions_have_none() {
        use hvstats_abi::catalog::vp;
        // Partition 1 is an observed Windows guest whose kvm_hv sources give its synthetic
        // interrupts and flushes; partition 2 is one of ours, whose page declares every counter
        // the catalog does not maintain for it unavailable, so its reading leaves them out.
        let mut instance = synthetic_instance(2, 1);
        instance.partitions[0].name = "windows".into();
        instance.partitions[1].name = "ours".into();
        let observed = &mut instance.partitions[0].vps[0].reading;
        with(observed, vp::SYNTHETIC_INTERRUPTS, 4_321);
        with(observed, vp::LOCAL_FLUSHED_GVA_RANGES, 96);
        with(observed, vp::ADDRESS_SPACE_FLUSHES, 17);
        let ObjectReading::Counters(own) = &mut instance.partitions[1].vps[0].reading else { panic!() };
        own.retain(|(c, _)| c.maintained.is_maintained());
        let reading = crate::live::Reading::of(vec![instance]);
        let text = Exposition::new(reading, 4).collect(Selection::all()).encode().unwrap();
        assert_eq!(
            lines_of(&text, "hvstats_vp_synthetic_interrupts_total{"),
            ["hvstats_vp_synthetic_interrupts_total{vm=\"windows\",vp=\"0\"} 4321"],
            "{text}"
        );
        assert_eq!(
            lines_of(&text, "hvstats_vp_local_flushed_gva_ranges_total{"),
            ["hvstats_vp_local_flushed_gva_ranges_total{vm=\"windows\",vp=\"0\"} 96"]
        );
        assert_eq!(
            lines_of(&text, "hvstats_vp_address_space_flushes_total{"),
            ["hvstats_vp_address_space_flushes_total{vm=\"windows\",vp=\"0\"} 17"]
        );
        // Our own partition still has its maintained counters, and none of the others.
        assert_eq!(lines_of(&text, "hvstats_vp_hypercalls_total{vm=\"ours\"").len(), 1, "{text}");
        for family in crate::metrics::families() {
            if family.members.iter().all(|m| !m.counter.maintained.is_maintained()) {
                let series = format!("{}{{vm=\"ours\"", family.exposed_name());
                assert!(!text.contains(&series), "{series} for our own partition:\n{text}");
            }
        }
    }

    /// `reading` with `counter` set to `value`.
    fn with(reading: &mut ObjectReading, counter: hvstats_abi::CounterId, value: u64) {
        let ObjectReading::Counters(values) = reading else { panic!("not read") };
        values.iter_mut().find(|(c, _)| c.id == counter).unwrap().1 = value;
    }

    #[test]
    fn the_observers_health_and_each_vms_state_have_the_names_dashboards_use() {
        use hvstats_abi::catalog::{hypervisor, partition};
        let mut instance = synthetic_instance(2, 1);
        instance.description.kind = hvstats::index::OBSERVER_KIND.into();
        let hv = &mut instance.hypervisor;
        with(hv, hypervisor::OBSERVER_UP, 1);
        with(hv, hypervisor::OBSERVER_LAST_REFRESH, 17_000_000_005_000_000);
        with(hv, hypervisor::OBSERVER_VMS_ATTACHED, 2);
        with(hv, hypervisor::OBSERVER_VMS_REFUSED, 3);
        for reason in hvstats_abi::refusal::Refusal::ALL {
            with(hv, reason.row(), 0);
        }
        with(hv, hypervisor::OBSERVER_VMS_REFUSED_NO_CAP_SYS_PTRACE, 2);
        with(hv, hypervisor::OBSERVER_VMS_REFUSED_DESCRIPTOR_BUDGET, 1);
        with(hv, hypervisor::OBSERVER_QMP_SESSIONS_UP, 1);
        instance.partitions[0].name = "stuck".into();
        with(&mut instance.partitions[0].reading, partition::VM_STATE, VmState::InternalError.code());
        instance.partitions[1].name = "held".into();
        with(&mut instance.partitions[1].reading, partition::VM_STATE, VmState::Paused.code());
        let mut reading = crate::live::Reading::of(vec![instance]);
        reading.dead_observers = vec!["777-5-0".into()];
        let text = Exposition::new(reading, 100).encode().unwrap();
        let p = "publisher=\"4242-1-0\"";
        for line in [
            format!("hvstats_observer_up{{{p}}} 1"),
            "hvstats_observer_up{publisher=\"777-5-0\"} 0".to_owned(),
            format!("hvstats_observer_last_refresh_timestamp_seconds{{{p}}} 1700000000.5"),
            format!("hvstats_observer_vms{{{p},state=\"attached\"}} 2"),
            // One series per reason of the refusal table, 0 where none is refused for it; their
            // sum is no series of its own.
            format!("hvstats_observer_vms{{{p},state=\"refused\",reason=\"no_cap_sys_ptrace\"}} 2"),
            format!("hvstats_observer_vms{{{p},state=\"refused\",reason=\"descriptor_budget\"}} 1"),
            format!("hvstats_observer_vms{{{p},state=\"refused\",reason=\"claimed_elsewhere\"}} 0"),
            format!("hvstats_observer_qmp_sessions_up{{{p}}} 1"),
            "hvstats_vm_state{vm=\"stuck\",state=\"internal-error\"} 1".to_owned(),
            "hvstats_vm_state{vm=\"stuck\",state=\"running\"} 0".to_owned(),
            "hvstats_vm_state{vm=\"held\",state=\"paused\"} 1".to_owned(),
            // A VM stuck on an internal error is not an idle VM that is up.
            "hvstats_vm_up{vm=\"stuck\"} 0".to_owned(),
            "hvstats_vm_up{vm=\"held\"} 1".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
        // A state set: one series per state, exactly one of them 1.
        let stuck: Vec<&str> = lines_of(&text, "hvstats_vm_state{vm=\"stuck\"");
        assert_eq!(stuck.len(), VmState::ALL.len(), "{stuck:?}");
        assert_eq!(stuck.iter().filter(|l| l.ends_with(" 1")).count(), 1);
        assert_eq!(text.matches("# TYPE hvstats_observer_up gauge").count(), 1, "one family");
        let refused = lines_of(&text, &format!("hvstats_observer_vms{{{p},state=\"refused\""));
        assert_eq!(refused.len(), hvstats_abi::refusal::Refusal::ALL.len(), "{refused:?}");
    }

    /// The label values of every sample of a counter or histogram family in `text`.
    fn counter_label_values(text: &str) -> Vec<String> {
        let counted: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter(|l| l.ends_with(" counter") || l.ends_with(" histogram"))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut values = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, rest)) = line.split_once('{') else { continue };
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            if !counted.contains(&family) {
                continue;
            }
            let labels = rest.rsplit_once('}').map_or("", |(l, _)| l);
            values.extend(
                labels
                    .split("\",")
                    .filter_map(|kv| Some(kv.split_once("=\"")?.1.trim_end_matches('"').to_owned())),
            );
        }
        values
    }

    #[test]
    fn no_counter_series_has_a_pid_in_a_label_and_shared_names_stay_apart() {
        // Two publishers (pids 4242 and 5353) of partitions named alike, one unnamed.
        let mut a = synthetic_instance(2, 1);
        a.partitions[0].name = "web".into();
        let mut b = synthetic_instance(2, 1);
        b.name = "5353-7-0".into();
        b.pid = 5353;
        b.partitions[0].name = "web".into();
        b.partitions[1].name = "web#2".into();
        let text = Exposition::new(crate::live::Reading::of(vec![a, b]), 100).encode().unwrap();
        let values = counter_label_values(&text);
        assert!(values.len() > 100, "{text}");
        for v in &values {
            assert!(!v.contains("4242") && !v.contains("5353"), "a pid in a counter label: {v}");
        }
        let vms: std::collections::BTreeSet<String> = lines_of(&text, "hvstats_vp_hypercalls_total{")
            .iter()
            .filter_map(|l| Some(l.split("vm=\"").nth(1)?.split('"').next()?.to_owned()))
            .collect();
        // The first "web" keeps its name, the second is not given the name "web#2" already has.
        assert_eq!(vms.into_iter().collect::<Vec<_>>(), ["partition-2", "web", "web#2", "web#3"], "{text}");
        // What changes with the process is on the info series only.
        let info = lines_of(&text, "hvstats_vm_info{");
        assert!(
            info.iter().any(|l| l.contains("vm=\"web#3\"") && l.contains("publisher_pid=\"5353\"")),
            "{info:?}"
        );
    }

    #[test]
    fn the_senior_vm_keeps_its_label_and_newcomers_are_told_apart() {
        // An observer started later (`5-900-0`) walks first: it holds an older publisher's
        // name only by its walk order, which gives it nothing.
        let named = |instance: &str, names: &[&str]| {
            let mut i = synthetic_instance(names.len() as u32, 1);
            i.name = instance.to_owned();
            for (p, name) in i.partitions.iter_mut().zip(names) {
                p.name = (*name).to_owned();
            }
            i
        };
        let reading = crate::live::Reading::of(vec![
            named("5-900-0", &["prod-db", "web"]),
            named("7-100-0", &["other", "prod-db", "prod\u{200b}-db", "prod-db"]),
        ]);
        let labels = vm_labels(&reading);
        // The suffixes follow seniority too: the later publisher's comes last.
        assert_eq!(labels, ["prod-db#3", "web", "other", "prod-db", r"prod\u{200b}-db", "prod-db#2"]);
    }

    #[test]
    fn unmapped_values_are_one_generic_family_named_by_object_and_name() {
        use hvstats::unmapped::{ObjectRef, Unmapped};
        let mut reading = crate::live::Reading::of(vec![synthetic_instance(2, 2)]);
        let plain = Exposition::new(reading.clone(), 10).encode().unwrap();
        assert!(!plain.contains("hvstats_mshv_"), "no mshv instance, no mshv family");
        let instance = &mut reading.instances[0];
        let id = instance.partitions[0].id;
        let mut unmapped = Unmapped::new();
        unmapped.insert(ObjectRef::Hypervisor, vec![("HvSubsumedPages".into(), 4)]);
        unmapped.insert(ObjectRef::Vp(id, 1), vec![("VpVtl1DispatchCount".into(), u64::MAX)]);
        unmapped.insert(ObjectRef::Partition(id), vec![("PtPagesShattered".into(), 9)]);
        instance.unmapped = Some(unmapped);
        let name = instance.name.clone();
        let text = Exposition::new(reading.clone(), 10).encode().unwrap();
        let counter = lines_of(&text, "hvstats_mshv_value{");
        assert_eq!(
            counter,
            [
                format!(
                    "hvstats_mshv_value{{publisher=\"{name}\",object=\"hypervisor\",name=\"HvSubsumedPages\"}} 4"
                ),
                format!(
                    "hvstats_mshv_value{{publisher=\"{name}\",object=\"partition\",partition=\"{id}\",name=\"PtPagesShattered\"}} 9"
                ),
                format!(
                    "hvstats_mshv_value{{publisher=\"{name}\",object=\"vp\",partition=\"{id}\",vp=\"1\",name=\"VpVtl1DispatchCount\"}} {}",
                    u64::MAX
                ),
            ]
        );
        let info = lines_of(&text, "hvstats_mshv_instance_info{");
        assert_eq!(info.len(), 1, "{text}");
        assert!(info[0].contains("source=\"mshv\"") && info[0].ends_with(" 1"), "{}", info[0]);
        // Past the VP cap the VPs' values are left out; the partition's stay.
        assert_eq!(
            lines_of(&text, "hvstats_mshv_values_omitted{"),
            [format!("hvstats_mshv_values_omitted{{publisher=\"{name}\"}} 0")]
        );
        // Past the VP cap the VPs' values are left out, and counted; the partition's stay.
        let capped = Exposition::new(reading.clone(), 1).encode().unwrap();
        assert_eq!(lines_of(&capped, "hvstats_mshv_value{").len(), 2, "{capped}");
        let omitted = format!("hvstats_mshv_values_omitted{{publisher=\"{name}\"}} 1");
        assert_eq!(lines_of(&capped, "hvstats_mshv_values_omitted{"), [omitted]);
        // The cap counts partitions and LPs as objects too: a second partition's values past it
        // are left out, however many names each object has.
        let other = reading.instances[0].partitions[1].id;
        let many: Vec<(String, u64)> = (0..1000).map(|i| (format!("PtNew{i}"), i)).collect();
        reading.instances[0].unmapped.as_mut().unwrap().insert(ObjectRef::Partition(other), many);
        let capped = Exposition::new(reading, 1).encode().unwrap();
        assert_eq!(lines_of(&capped, "hvstats_mshv_value{").len(), 2, "{capped}");
        let omitted = format!("hvstats_mshv_values_omitted{{publisher=\"{name}\"}} 1001");
        assert_eq!(lines_of(&capped, "hvstats_mshv_values_omitted{"), [omitted]);
    }

    /// A reading of one partition of 4 VPs, every VP with histograms.
    fn four_vps_with_histograms() -> crate::live::Reading {
        let mut instance = synthetic_instance(1, 4);
        for vp in &mut instance.partitions[0].vps {
            let mut h = Log2Histogram::default();
            for ns in [0, 900, 1_500, 70_000] {
                h.record(ns);
            }
            vp.histograms = crate::metrics::histogram_families()
                .iter()
                .filter_map(|f| Some((f.members.first()?.counter, h)))
                .collect();
        }
        crate::live::Reading::of(vec![instance])
    }

    /// The sample lines of `text` whose labels hold `vp="N"` for a VP index N.
    fn per_vp_series(text: &str) -> usize {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains("vp=\"") && !l.contains("vp=\"all\""))
            .count()
    }

    #[test]
    fn the_default_collectors_carry_at_most_20_series_per_vp_and_no_buckets() {
        let reading = four_vps_with_histograms();
        let all = Exposition::new(reading.clone(), 100).encode().unwrap();
        let default = Exposition::new(reading.clone(), 100).collect(Selection::defaults()).encode().unwrap();
        let (all_per_vp, default_per_vp) = (per_vp_series(&all) / 4, per_vp_series(&default) / 4);
        assert!((15..=20).contains(&default_per_vp), "{default_per_vp} series per VP\n{default}");
        assert!(all_per_vp > 100, "{all_per_vp}");
        assert!(!default.contains("_bucket{"), "{default}");
        for name in crate::collectors::ESSENTIAL_VP {
            assert!(default.contains(&format!("\n{name}{{")), "no {name}");
        }
        // The intercept time is the VM's (its VPs summed), unless VP detail is asked for; but for
        // the time halted, which stays each VP's and is never in the VM's sum.
        let time: Vec<&str> = lines_of(&default, "hvstats_vp_intercept_seconds_total{");
        let (halted, handling): (Vec<&str>, Vec<&str>) =
            time.iter().partition(|l| l.contains("intercept=\"hlt\""));
        assert!(!handling.is_empty() && handling.iter().all(|l| l.contains("vp=\"all\"")), "{time:?}");
        assert_eq!(halted.len(), 4, "one time halted per VP: {time:?}");
        assert!(halted.iter().all(|l| !l.contains("vp=\"all\"")), "{time:?}");
        let detail = Exposition::new(reading.clone(), 100)
            .collect(Selection::defaults().with(Collector::VpDetail))
            .encode()
            .unwrap();
        let time: Vec<&str> = lines_of(&detail, "hvstats_vp_intercept_seconds_total{");
        assert_eq!(time.iter().filter(|l| l.contains("vp=\"all\"")).count(), 0, "{time:?}");
        assert!(time.iter().any(|l| l.contains("vp=\"3\"")));
        // Histograms: per VP with `histograms`, per VM with `histograms-vm`.
        let hist = Exposition::new(reading.clone(), 100)
            .collect(Selection::defaults().with(Collector::Histograms))
            .encode()
            .unwrap();
        let buckets = lines_of(&hist, "hvstats_vp_hypercall_duration_seconds_bucket{");
        assert_eq!(buckets.len(), 4 * hvstats_abi::histogram::BUCKETS, "{hist}");
        let by_vm = Exposition::new(reading.clone(), 100)
            .collect(Selection::defaults().with(Collector::HistogramsVm))
            .encode()
            .unwrap();
        let buckets = lines_of(&by_vm, "hvstats_vp_hypercall_duration_seconds_bucket{");
        assert_eq!(buckets.len(), hvstats_abi::histogram::BUCKETS);
        assert!(buckets.iter().all(|l| l.contains("vp=\"all\"")));
        assert!(
            by_vm.contains("hvstats_vp_hypercall_duration_seconds_count{vm=\"partition-1\",vp=\"all\"} 16\n")
        );
        // Nothing of a collector left out.
        let vp_only =
            Exposition::new(reading, 100).collect(Selection::NONE.with(Collector::Vp)).encode().unwrap();
        assert!(!vp_only.contains("hvstats_build_info") && !vp_only.contains("hvstats_vm_"), "{vp_only}");
    }

    #[test]
    fn every_family_a_scrape_carries_is_declared_with_its_collector() {
        let mut reading = four_vps_with_histograms();
        reading.instances[0].unmapped = Some(hvstats::unmapped::Unmapped::new());
        let text = Exposition::new(reading.clone(), 100).read_in(std::time::Duration::ZERO).encode().unwrap();
        let declared = crate::collectors::exported_families();
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert!(types.len() > 50, "{text}");
        for name in &types {
            let counter = format!("{name}_total");
            assert!(
                declared.iter().any(|(n, _, _)| n == name || *n == counter),
                "{name} is carried but not declared"
            );
        }
        // Each collector alone carries exactly its declared families.
        for info in crate::collectors::COLLECTORS {
            let alone = Exposition::new(reading.clone(), 100)
                .read_in(std::time::Duration::ZERO)
                .collect(Selection::NONE.with(info.collector))
                .encode()
                .unwrap();
            for line in alone.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
                let name = line.split(' ').next().unwrap();
                let counter = format!("{name}_total");
                let of = declared.iter().find(|(n, _, _)| n == name || *n == counter).unwrap();
                let histogram_vm = info.collector == Collector::HistogramsVm && of.2;
                assert!(of.1 == info.collector || histogram_vm, "{name} under {}", info.name);
            }
        }
    }

    #[test]
    fn the_protobuf_exposition_has_the_texts_series_and_native_histograms() {
        let reading = four_vps_with_histograms();
        let selection = Selection::defaults().with(Collector::Histograms).with(Collector::Created);
        let text = Exposition::new(reading.clone(), 100).collect(selection).encode().unwrap();
        let families =
            crate::protobuf::decode(&Exposition::new(reading, 100).collect(selection).encode_protobuf())
                .unwrap();
        let name = |f: &crate::protobuf::MetricFamily| f.name.clone().unwrap_or_default();
        let hypercalls = families.iter().find(|f| name(f) == "hvstats_vp_hypercalls_total").unwrap();
        assert_eq!(hypercalls.metric.len(), 4);
        let first = &hypercalls.metric[0];
        let line = lines_of(&text, "hvstats_vp_hypercalls_total{vm=\"partition-1\",vp=\"0\"}")[0];
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(first.counter.as_ref().and_then(|c| c.value), Some(value));
        // Its `_created` is the partition's creation, in both formats.
        let created = lines_of(&text, "hvstats_vp_hypercalls_created{vm=\"partition-1\",vp=\"0\"}")[0];
        let (secs, micros) = created.rsplit(' ').next().unwrap().split_once('.').unwrap();
        let at = first.counter.as_ref().and_then(|c| c.created_timestamp.clone()).unwrap();
        assert_eq!(
            (at.seconds, at.nanos),
            (secs.parse().ok(), micros.parse::<i32>().ok().map(|us| us * 1_000))
        );
        let h = families.iter().find(|f| name(f) == "hvstats_vp_hypercall_duration_seconds").unwrap();
        assert_eq!(h.metric.len(), 4);
        let native = h.metric[0].histogram.as_ref().unwrap();
        assert_eq!((native.sample_count, native.zero_count, native.schema), (Some(4), Some(1), Some(0)));
        // Every sample line of the text is one metric of the protobuf, but for the buckets.
        let samples = text.lines().filter(|l| !l.starts_with('#') && !l.contains("_created")).count();
        let classic_parts = 4 * 8 * (hvstats_abi::histogram::BUCKETS + 2) - 4 * 8;
        let metrics: usize = families.iter().map(|f| f.metric.len()).sum();
        assert_eq!(metrics, samples - classic_parts);
    }

    #[test]
    fn the_classic_format_names_counter_samples_and_drops_openmetrics_lines() {
        let om = "# HELP hvstats_vp_hypercalls Hypercalls.\n# TYPE hvstats_vp_hypercalls counter\n\
                  hvstats_vp_hypercalls_total{vp=\"0\"} 3\nhvstats_vp_hypercalls_created{vp=\"0\"} 1.5\n\
                  # HELP hvstats_partition_gpa_bytes GPA.\n\
                  # TYPE hvstats_partition_gpa_bytes gauge\n# UNIT hvstats_partition_gpa_bytes bytes\n\
                  hvstats_partition_gpa_bytes 4096\n# EOF\n";
        assert_eq!(
            to_classic(om),
            "# HELP hvstats_vp_hypercalls_total Hypercalls.\n# TYPE hvstats_vp_hypercalls_total counter\n\
             hvstats_vp_hypercalls_total{vp=\"0\"} 3\n# HELP hvstats_partition_gpa_bytes GPA.\n\
             # TYPE hvstats_partition_gpa_bytes gauge\nhvstats_partition_gpa_bytes 4096\n"
        );
        assert!(accepts_openmetrics("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"));
        assert!(!accepts_openmetrics("*/*"));
    }
}
