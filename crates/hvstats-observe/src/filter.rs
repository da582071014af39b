//! Which VMs an observer takes: `--vm` and `--exclude-vm`, each naming VMs by pid, UUID or a
//! regular expression on the name.
//!
//! A fleet host runs VMs an operator wants watched and VMs another tool (or another observer)
//! should keep: the filter is decided once per VMM process, from what its command line says
//! (the name and UUID its VMM was given), before anything is opened on it.

use hvstats::vmm::VmUuid;

/// One way to name VMs.
#[derive(Clone, Debug)]
pub enum VmPattern {
    /// The VMM process.
    Pid(i32),
    /// The VM's UUID (QEMU's `-uuid`).
    Uuid(VmUuid),
    /// A regular expression the VM's name matches (anywhere: anchor it with `^…$`).
    Name(regex::Regex),
}

/// A `--vm` value that is none of a pid, a UUID or a regular expression.
#[derive(Debug, thiserror::Error)]
#[error("{value:?} is not a pid, a UUID or a regular expression: {source}")]
pub struct PatternError {
    value: String,
    #[source]
    source: regex::Error,
}

impl VmPattern {
    /// A pid when `value` is a positive number, a UUID when it reads as one, else a regular
    /// expression on the name.
    ///
    /// # Errors
    /// When it is none of those.
    pub fn parse(value: &str) -> Result<Self, PatternError> {
        if let Ok(pid) = value.parse::<i32>()
            && pid > 0
        {
            return Ok(VmPattern::Pid(pid));
        }
        if let Some(uuid) = VmUuid::parse(value) {
            return Ok(VmPattern::Uuid(uuid));
        }
        regex::Regex::new(value)
            .map(VmPattern::Name)
            .map_err(|source| PatternError { value: value.to_owned(), source })
    }

    fn matches(&self, vm: &VmIdentity<'_>) -> bool {
        match self {
            VmPattern::Pid(pid) => *pid == vm.pid,
            VmPattern::Uuid(uuid) => vm.uuid == Some(*uuid),
            VmPattern::Name(re) => re.is_match(vm.name),
        }
    }
}

/// What a VM is known by when the filter decides.
#[derive(Clone, Copy, Debug)]
pub struct VmIdentity<'a> {
    /// The VMM process.
    pub pid: i32,
    /// The VM's name (from the VMM's command line).
    pub name: &'a str,
    /// Its UUID, when the VMM was given one.
    pub uuid: Option<VmUuid>,
}

/// The VMs to take: those any `include` names (all when there is none), less those any
/// `exclude` names.
#[derive(Clone, Debug, Default)]
pub struct VmFilter {
    /// `--vm`.
    pub include: Vec<VmPattern>,
    /// `--exclude-vm`.
    pub exclude: Vec<VmPattern>,
}

impl VmFilter {
    /// True when the filter takes every VM.
    pub fn is_empty(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }

    /// True when `vm` is taken.
    pub fn takes(&self, vm: &VmIdentity<'_>) -> bool {
        (self.include.is_empty() || self.include.iter().any(|p| p.matches(vm)))
            && !self.exclude.iter().any(|p| p.matches(vm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vms_are_named_by_pid_uuid_or_name() {
        let uuid = "1f0b7c1e-8d2a-4c3b-9e4f-5a6b7c8d9e0f";
        let vm = VmIdentity { pid: 4242, name: "db-1", uuid: VmUuid::parse(uuid) };
        let filter = |include: &[&str], exclude: &[&str]| VmFilter {
            include: include.iter().map(|p| VmPattern::parse(p).unwrap()).collect(),
            exclude: exclude.iter().map(|p| VmPattern::parse(p).unwrap()).collect(),
        };
        assert!(filter(&[], &[]).takes(&vm));
        assert!(filter(&["4242"], &[]).takes(&vm));
        assert!(!filter(&["4243"], &[]).takes(&vm));
        assert!(filter(&[uuid], &[]).takes(&vm));
        assert!(filter(&["^db-"], &[]).takes(&vm));
        assert!(!filter(&["^web"], &[]).takes(&vm));
        assert!(!filter(&["^db-"], &["4242"]).takes(&vm), "an exclusion wins");
        assert!(!filter(&[], &[uuid]).takes(&vm));
        assert!(matches!(VmPattern::parse("0"), Ok(VmPattern::Name(_))), "0 is no pid");
        let e = VmPattern::parse("db-(").unwrap_err();
        assert!(e.to_string().starts_with("\"db-(\" is not a pid, a UUID or a regular expression"), "{e}");
    }
}
