//! The sections of the man pages that `--help` has no place for: PRIVILEGES, FILES, ENVIRONMENT,
//! EXIT STATUS and EXAMPLES, per command. The synopsis, description and options come from the
//! clap definitions (`hvstats man` renders both), so this is the one source of what a page says
//! beyond its flags; the exit statuses come from [`ExitStatus`] itself.

use crate::output::ExitStatus;

/// What a page says beyond its flags.
struct Sections {
    privileges: &'static str,
    files: &'static str,
    environment: &'static [(&'static str, &'static str)],
    examples: &'static [(&'static str, &'static str)],
}

/// The runtime directory, which every reader and publisher uses.
const RUNTIME_ENV: (&str, &str) = (
    "HVSTATS_RUNTIME_DIR",
    "The runtime directory where --runtime-dir is not given (default /run/hvstats). A directory that does not exist is an error, never created.",
);
const LIBVIRT_ENV: (&str, &str) = (
    "LIBVIRT_DEFAULT_URI",
    "libvirt's URI; its socket= (or the usual /run/libvirt/libvirt-sock-ro) is where the statistics of libvirt's domains are read, read-only.",
);
const KUBELET_ENV: (&str, &str) = (
    hvstats_observe::sources::pod_libvirt::KUBELET_ROOT_ENV,
    "The kubelet's root directory (default /var/lib/kubelet), under whose pods/<UID>/volumes/kubernetes.io~empty-dir/libvirt-runtime/ a KubeVirt pod's own libvirt socket is looked for.",
);
const PMU_ENV: (&str, &str) = (
    "HVSTATS_PMU",
    "The PMU's shape, instead of what the host reports: none[,cpus=N] or gp=G,fixed=F,cpus=N[,gp_width=W][,fixed_width=W].",
);

const RUNTIME_FILES: &str = "/run/hvstats (or HVSTATS_RUNTIME_DIR): instances/, the files of the live instances; observed/, the observers' claims, the hardware counter table hwc/. Only a directory of this user's that no one else may write is used.";

const READER: &str = "None beyond reading the runtime directory: its owner (root for /run/hvstats) reads every instance; another user reads the instances published there for all to read.";

/// The sections of `hvstats observe`.
const OBSERVE: Sections = Sections {
    privileges: "Observing another process's VM needs, for its /proc/PID/fd: CAP_DAC_READ_SEARCH when the VMM runs as another user (Debian's libvirt runs QEMU as libvirt-qemu) and CAP_SYS_PTRACE (a ptrace access check; it also copies the VMM's KVM statistics descriptors with pidfd_getfd); CAP_PERFMON for the kvm tracepoints of its vCPU threads; CAP_BPF to count them in the kernel (without it, perf counters per thread, at a higher cost to the guest). tracefs must be mounted. Root has them all; hvstats-observe.service grants exactly these. Each of these it lacks is said once at start, with what it costs and the unit line that gives it; a VM it may not read is counted as refused for that reason (hvstats_observer_vms{state=\"refused\",reason=\"no_cap_sys_ptrace\"}) and logged once with the fix. --mshv reads Linux's mshv debugfs tree, which needs root.",
    files: "/run/hvstats/: the observer's instance and its claims, observed/ (one claim per observed VMM, so two observers never count one VM twice). /etc/default/hvstats: HVSTATS_OBSERVE_ARGS, the flags hvstats-observe.service adds to observe --all. /sys/kernel/tracing, /sys/kernel/debug/kvm: read. The QMP sockets QEMU's command line names, wherever they are.",
    environment: &[RUNTIME_ENV, LIBVIRT_ENV, KUBELET_ENV],
    examples: &[
        ("hvstats observe --all", "every KVM VM on the host, and those that start later"),
        (
            "hvstats observe --pid 4242 --qmp /run/vm1.qmp",
            "one QEMU, with KVM's statistics from its QMP socket",
        ),
        ("hvstats observe --all --exclude-vm '^test-'", "all but the VMs whose name starts with test-"),
        (
            "systemctl enable --now hvstats-observe",
            "the same as a service, as the Debian package installs it",
        ),
    ],
};

/// The sections of `hvstats serve`.
const SERVE: Sections = Sections {
    privileges: "None: it reads the instances' files (root's own under /run/hvstats, so run it as root, or as the runtime directory's owner) and /proc for their publishers' liveness. --observe-all needs what hvstats observe needs; hvstats-serve.service keeps no capability and leaves observing to hvstats-observe.service.",
    files: "/run/hvstats/: the instances it exports; serve.sock, its socket when --listen is not given. /etc/default/hvstats: HVSTATS_SERVE_ARGS, its flags under hvstats-serve.service (the package's: --listen 127.0.0.1:9966). The --web.config.file (e.g. /etc/hvstats/web.yml): TLS and bcrypt basic authentication, as the Prometheus exporter toolkit reads it.",
    environment: &[RUNTIME_ENV, LIBVIRT_ENV],
    examples: &[
        ("hvstats serve", "on /run/hvstats/serve.sock, which only root may connect to"),
        ("curl -s --unix-socket /run/hvstats/serve.sock http://x/metrics", "read it"),
        (
            "hvstats serve --listen 127.0.0.1:9966",
            "on TCP, as the package's unit does: every local user can read it",
        ),
        (
            "hvstats serve --listen :9966 --web.config.file /etc/hvstats/web.yml",
            "every address, IPv4 and IPv6, behind TLS and a password",
        ),
    ],
};

/// The sections of `hvstats run`.
const RUN: Sections = Sections {
    privileges: "Read and write access to /dev/kvm (root, or the kvm group). Counting exits by tracepoint needs CAP_PERFMON or perf_event_paranoid <= 1; without it those counters are unavailable, never 0.",
    files: RUNTIME_FILES,
    environment: &[RUNTIME_ENV, PMU_ENV],
    examples: &[
        ("hvstats run", "the built-in demo guest, then its counters"),
        ("hvstats run --vps 4 --duration 10 --json", "four VPs for ten seconds, as JSON"),
    ],
};

/// The sections of `hvstats hwc`.
const HWC: Sections = Sections {
    privileges: "Listing needs none; allocating and freeing need write access to the runtime directory's hwc/ table (root for /run/hvstats).",
    files: "/run/hvstats/hwc/ (or under HVSTATS_RUNTIME_DIR): the host's table of hardware counter allocations, shared by every hvstats process.",
    environment: &[RUNTIME_ENV, PMU_ENV],
    examples: &[
        ("hvstats hwc list", "the PMU and who holds which counters"),
        ("hvstats hwc list --json", "the same, as JSON"),
    ],
};

/// The sections of `hvstats record`.
const RECORD: Sections = Sections {
    privileges: READER,
    files: "The recording it writes (-o), newline-delimited JSON. /run/hvstats: the instances it samples.",
    environment: &[RUNTIME_ENV],
    examples: &[("hvstats record --interval 1 --duration 60 -o r.ndjson", "a minute of every live instance")],
};

/// The sections of `hvstats report` and `hvstats plot`, which read a recording.
const RECORDING_READERS: Sections = Sections {
    privileges: "None: it reads the recording file only.",
    files: "The recording (newline-delimited JSON, as hvstats record writes it); plot writes its chart (-o, PNG or SVG).",
    environment: &[],
    examples: &[
        ("hvstats report r.ndjson", "per-VP totals, rates, costs and CPU wait"),
        ("hvstats plot r.ndjson -o chart.png --counter 'IO instructions/sec'", "a chart of one counter"),
    ],
};

/// The sections of `hvstats dump` and `hvstats catalog`, which read no instance.
const OFFLINE: Sections = Sections {
    privileges: "None.",
    files: "dump: the page file it decodes (exactly 4096 bytes).",
    environment: &[],
    examples: &[("hvstats catalog", "every counter"), ("hvstats dump some.page", "decode a stats page")],
};

/// The sections of `hvstats bench`.
const BENCH: Sections = Sections {
    privileges: "As hvstats run for its own partitions (/dev/kvm), and as hvstats observe for the rows that observe a QEMU.",
    files: "hvstats-bench, the development tool it runs, beside hvstats or on PATH.",
    environment: &[("PATH", "Where hvstats-bench is looked for when it is not beside hvstats.")],
    examples: &[("hvstats bench", "every row, each beside its baseline")],
};

/// The sections of `hvstats man` and `hvstats completions`.
const INSTALL: Sections = Sections {
    privileges: "Write access to the --out-dir (man) only.",
    files: "man: hvstats.1 and hvstats-COMMAND.1 in --out-dir.",
    environment: &[],
    examples: &[
        ("hvstats man --out-dir /usr/local/share/man/man1", "every page"),
        ("hvstats completions bash > /etc/bash_completion.d/hvstats", "bash completion"),
    ],
};

/// The sections of `hvstats snapshot`, `hvstats top`, and the top-level page.
const READERS: Sections = Sections {
    privileges: READER,
    files: "/run/hvstats (or HVSTATS_RUNTIME_DIR): the live instances. /etc/default/hvstats: the flags of hvstats-serve.service (HVSTATS_SERVE_ARGS) and hvstats-observe.service (HVSTATS_OBSERVE_ARGS).",
    environment: &[RUNTIME_ENV],
    examples: &[
        ("hvstats snapshot", "every counter of every live instance"),
        ("hvstats top --once --vm '^db-'", "one table of the VMs whose name starts with db-"),
        ("hvstats observe --all", "observe the host's KVM VMs (see hvstats-observe(1))"),
    ],
};

/// The sections of the page `command` (`hvstats-COMMAND`, or `hvstats` for the top-level page).
fn sections(command: &str) -> &'static Sections {
    match command {
        "hvstats-observe" => &OBSERVE,
        "hvstats-serve" => &SERVE,
        "hvstats-run" => &RUN,
        "hvstats-hwc" => &HWC,
        "hvstats-record" => &RECORD,
        "hvstats-report" | "hvstats-plot" => &RECORDING_READERS,
        "hvstats-dump" | "hvstats-catalog" => &OFFLINE,
        "hvstats-bench" => &BENCH,
        "hvstats-man" | "hvstats-completions" => &INSTALL,
        _ => &READERS,
    }
}

/// Escapes text for roff: backslashes, and a leading dot or quote that would start a request.
fn roff(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    match text.starts_with(['.', '\'']) {
        true => format!("\\&{text}"),
        false => text,
    }
}

/// The roff of PRIVILEGES, FILES, ENVIRONMENT, EXIT STATUS and EXAMPLES for the page `name`
/// (`hvstats`, `hvstats-observe`, …).
pub(crate) fn extra_sections(name: &str) -> String {
    let s = sections(name);
    let mut out = String::new();
    let tagged = |out: &mut String, tag: &str, text: &str| {
        out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(tag), roff(text)));
    };
    out.push_str(&format!(".SH PRIVILEGES\n{}\n", roff(s.privileges)));
    out.push_str(&format!(".SH FILES\n{}\n", roff(s.files)));
    out.push_str(".SH ENVIRONMENT\n");
    if s.environment.is_empty() {
        out.push_str("None is read.\n");
    }
    for (var, meaning) in s.environment {
        tagged(&mut out, var, meaning);
    }
    out.push_str(".SH \"EXIT STATUS\"\n");
    for status in ExitStatus::ALL {
        if status.applies_to(name) {
            tagged(&mut out, &(status as u8).to_string(), status.meaning());
        }
    }
    out.push_str(".SH EXAMPLES\n");
    for (command, what) in s.examples {
        out.push_str(&format!(".TP\n.B {}\n{}\n", roff(command), roff(what)));
    }
    out
}

/// `page` (clap_mangen's roff of the page `name`) with [`extra_sections`] before its VERSION
/// section (at its end when it has none).
pub(crate) fn with_extra_sections(page: &str, name: &str) -> String {
    let extra = extra_sections(name);
    match page.find("\n.SH VERSION") {
        Some(at) => format!("{}\n{extra}{}", &page[..at], &page[at + 1..]),
        None => format!("{page}{extra}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_has_the_five_sections_and_run_alone_lists_the_signal_statuses() {
        for name in ["hvstats", "hvstats-observe", "hvstats-serve", "hvstats-run", "hvstats-top"] {
            let extra = extra_sections(name);
            for section in
                [".SH PRIVILEGES", ".SH FILES", ".SH ENVIRONMENT", ".SH \"EXIT STATUS\"", ".SH EXAMPLES"]
            {
                assert!(extra.contains(section), "{name}: {section}");
            }
            assert_eq!(extra.contains("\\fB130\\fR"), name == "hvstats-run" || name == "hvstats", "{name}");
        }
        assert!(extra_sections("hvstats-observe").contains("CAP_DAC_READ_SEARCH"));
        assert_eq!(roff(".x \\ -y"), "\\&.x \\e \\-y");
    }
}
