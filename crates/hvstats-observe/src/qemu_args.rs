//! QEMU's own reading of its command line, for the VM's name and UUID when QMP cannot say them.
//!
//! QEMU walks its arguments one by one: one that does not start with `-` is a disk image; an
//! option (`-x` or `--x`) takes the next argument as its value unless it is one of the few that
//! take none ([`QEMU_FLAGS`]). So `-append "-name x"` names nothing, and an option given twice
//! keeps its last value: `-uuid A -uuid B` is B. `-name` values are merged (QEMU's `name` option
//! list merges): each `guest=` (or leading bare value) overrides the ones before it, and a later
//! `-name debug-threads=on` keeps the name. A value's `,,` is a comma.

/// The options of QEMU that take no value (QEMU 7.2's, and ones older QEMUs had). Any other
/// option takes the next argument as its value.
pub const QEMU_FLAGS: &[&str] = &[
    "S",
    "alt-grab",
    "async-teardown",
    "audio-help",
    "ctrl-grab",
    "curses",
    "daemonize",
    "enable-fips",
    "enable-hax",
    "enable-kvm",
    "enable-sync-profile",
    "full-screen",
    "h",
    "help",
    "mem-prealloc",
    "no-acpi",
    "no-fd-bootchk",
    "no-frame",
    "no-hpet",
    "no-kvm",
    "no-kvm-irqchip",
    "no-kvm-pit",
    "no-kvm-pit-reinjection",
    "no-quit",
    "no-reboot",
    "no-shutdown",
    "no-user-config",
    "nodefaults",
    "nodefconfig",
    "nographic",
    "old-param",
    "only-migratable",
    "portrait",
    "preconfig",
    "rtc-td-hack",
    "s",
    "sdl",
    "semihosting",
    "show-cursor",
    "singlestep",
    "snapshot",
    "tdf",
    "usb",
    "version",
    "win2k-hack",
    "xen-attach",
    "xen-create",
    "xen-domid-restrict",
];

/// Each option of a QEMU command line (`args` without the program) with its value, in order, as
/// QEMU reads them: the option's name without its dashes, and its value (`None` for a flag).
pub fn options(args: &[String]) -> Vec<(&str, Option<&str>)> {
    let mut found = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let Some(option) = arg.strip_prefix('-').filter(|o| !o.is_empty()) else { continue };
        let option = option.strip_prefix('-').unwrap_or(option);
        if QEMU_FLAGS.contains(&option) {
            found.push((option, None));
        } else {
            found.push((option, it.next().map(String::as_str)));
        }
    }
    found
}

/// The comma-separated parts of a QEMU option value (`,,` is a comma inside a part).
pub fn parts(value: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                current.push(',');
            } else {
                parts.push(std::mem::take(&mut current));
            }
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

/// The guest name one `-name` value sets, if it sets one: its last `guest=N`, or a leading bare
/// `N` (the implied key).
pub(crate) fn guest_name(value: &str) -> Option<String> {
    let mut name = None;
    for (i, part) in parts(value).into_iter().enumerate() {
        if let Some(n) = part.strip_prefix("guest=") {
            name = Some(n.to_owned());
        } else if i == 0 && !part.contains('=') {
            name = Some(part);
        }
    }
    name
}

/// The VM's name as QEMU takes it from `args`: the last one any `-name` sets.
pub fn name(args: &[String]) -> Option<String> {
    options(args).into_iter().filter(|(o, _)| *o == "name").filter_map(|(_, v)| guest_name(v?)).next_back()
}

/// The VM's UUID as QEMU takes it from `args`: the last `-uuid`'s value.
pub fn uuid(args: &[String]) -> Option<&str> {
    options(args).into_iter().filter(|(o, _)| *o == "uuid").filter_map(|(_, v)| v).next_back()
}

/// The Hyper-V enlightenments QEMU gives the VM, from the last `-cpu` of `args` (QEMU takes the
/// last): a word of [`hvstats_abi::hyperv_features`], [`KNOWN`](hvstats_abi::hyperv_features::KNOWN)
/// set. A feature is on when named bare or `=on` (`yes`, `true`), off when `=off` (`no`,
/// `false`) or named again so; `hv-spinlocks=N` is on unless N is 0xffffffff (never notify);
/// unknown `hv-*` properties (`hv-vendor-id`) are not features.
pub fn hyperv_features(args: &[String]) -> u64 {
    use hvstats_abi::hyperv_features::{KNOWN, bit};
    let Some(cpu) = options(args).into_iter().filter(|(o, _)| *o == "cpu").filter_map(|(_, v)| v).next_back()
    else {
        return KNOWN;
    };
    let mut word = KNOWN;
    for part in parts(cpu).into_iter().skip(1) {
        let (name, value) = part.split_once('=').unwrap_or((&part, "on"));
        let Some(b) = bit(name) else { continue };
        let on = match value {
            "on" | "yes" | "true" => true,
            "off" | "no" | "false" => false,
            // hv-spinlocks takes the retry count: all ones is "never notify".
            v => {
                let n = v
                    .strip_prefix("0x")
                    .map_or_else(|| v.parse::<u64>().ok(), |h| u64::from_str_radix(h, 16).ok());
                n != Some(0xffff_ffff)
            }
        };
        if on { word |= b } else { word &= !b }
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_last_name_and_uuid_win_and_option_values_are_not_options() {
        let a = args(&[
            "-name",
            "first",
            "-S",
            "-append",
            "-name",
            "--name",
            "guest=second,debug-threads=on",
            "disk.img",
            "-name",
            "debug-threads=on",
            "-uuid",
            "11111111-1111-1111-1111-111111111111",
            "-nographic",
            "--uuid",
            "22222222-2222-2222-2222-222222222222",
        ]);
        assert_eq!(name(&a).as_deref(), Some("second"));
        assert_eq!(uuid(&a), Some("22222222-2222-2222-2222-222222222222"));
        // `-append`'s value is "-name": it sets nothing.
        assert_eq!(name(&args(&["-append", "-name", "x"])), None);
        assert_eq!(name(&args(&["-S", "-name", "x"])).as_deref(), Some("x"));
    }

    #[test]
    fn hyperv_features_are_those_of_the_last_cpu_option() {
        use hvstats_abi::hyperv_features::{KNOWN, names};
        let list = |a: &[&str]| names(hyperv_features(&args(a))).unwrap().collect::<Vec<_>>();
        // As libvirt writes them, and as Proxmox does (the old `_` spelling).
        let libvirt = [
            "-cpu",
            "host,migratable=on,hv-time=on,hv-relaxed=on,hv-vapic=on,hv-spinlocks=0x1fff,hv-vendor-id=KVM Hv",
        ];
        assert_eq!(list(&libvirt), ["hv-relaxed", "hv-vapic", "hv-time", "hv-spinlocks"]);
        let proxmox = [
            "-cpu",
            "kvm64,enforce,hv_ipi,hv_relaxed,hv_reset,hv_runtime,hv_spinlocks=0x1fff,hv_stimer,hv_synic,hv_time,hv_vapic,hv_vpindex,+kvm_pv_eoi",
        ];
        assert_eq!(list(&proxmox).len(), 10);
        assert_eq!(
            list(&["-cpu", "host,hv-relaxed,hv-relaxed=off,hv-spinlocks=0xffffffff"]),
            Vec::<&str>::new()
        );
        // The last -cpu wins; no -cpu is QEMU's default CPU, which has none: known, empty.
        assert_eq!(list(&["-cpu", "host,hv-synic", "-cpu", "host,hv-ipi"]), ["hv-ipi"]);
        assert_eq!(hyperv_features(&args(&["-name", "x"])), KNOWN);
        // The CPU model itself is no feature.
        assert_eq!(list(&["-cpu", "hv-relaxed"]), Vec::<&str>::new());
    }

    #[test]
    fn name_values_are_parsed_like_qemu_does() {
        assert_eq!(guest_name("guest=web1,debug-threads=on").as_deref(), Some("web1"));
        assert_eq!(guest_name("debug-threads=on,guest=db").as_deref(), Some("db"));
        assert_eq!(guest_name("plain").as_deref(), Some("plain"));
        assert_eq!(guest_name("a,,b,process=x").as_deref(), Some("a,b"));
        assert_eq!(guest_name("a,guest=b").as_deref(), Some("b"));
        assert_eq!(guest_name("debug-threads=on"), None);
    }
}
