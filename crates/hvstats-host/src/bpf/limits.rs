//! What this host and this process allow the engine's maps: the memory limit of the process's
//! cgroup (a systemd unit's `MemoryMax`), and the host's memory where none is set.

use std::path::Path;

/// The memory this process may use, in bytes: its cgroup's limit (v2 `memory.max`, v1
/// `memory.limit_in_bytes`) where one is set, never more than the host's memory; `None` when
/// neither can be read.
pub(crate) fn memory_bytes() -> Option<u64> {
    let host = host_memory();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_limit(&t, Path::new("/sys/fs/cgroup")));
    match (host, cgroup) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// The host's memory (`MemTotal` of `/proc/meminfo`), in bytes.
fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of the cgroup `proc_cgroup` (a `/proc/PID/cgroup`) names, with the cgroup
/// filesystems mounted at `root`: the v2 group's `memory.max`, else the v1 memory controller's
/// `memory.limit_in_bytes`; `None` where unlimited or unreadable.
fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let read = |path: &Path| std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse::<u64>().ok());
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let path = path.trim_start_matches('/');
        let limit = match controllers {
            "" => read(&root.join(path).join("memory.max")),
            c if c.split(',').any(|c| c == "memory") => {
                read(&root.join("memory").join(path).join("memory.limit_in_bytes"))
            }
            _ => None,
        };
        // v1 says "no limit" as a page-rounded i64::MAX.
        if let Some(limit) = limit.filter(|&l| l < 1 << 62) {
            return Some(limit);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_memory_max_is_read_from_its_cgroup_and_max_is_no_limit() {
        let root = std::env::temp_dir().join(format!("hvstats-limits-{}", std::process::id()));
        let unit = root.join("system.slice/hvstats-observe.service");
        std::fs::create_dir_all(&unit).unwrap();
        std::fs::write(unit.join("memory.max"), "1073741824\n").unwrap();
        let v2 = "0::/system.slice/hvstats-observe.service\n";
        assert_eq!(cgroup_limit(v2, &root), Some(1 << 30));
        std::fs::write(unit.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit(v2, &root), None);
        let v1 = root.join("memory/svc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit("4:memory:/svc\n1:cpu:/\n", &root), None);
        std::fs::write(v1.join("memory.limit_in_bytes"), "536870912\n").unwrap();
        assert_eq!(cgroup_limit("4:memory:/svc\n1:cpu:/\n", &root), Some(1 << 29));
        std::fs::remove_dir_all(&root).unwrap();
        assert!(host_memory().is_some_and(|m| m > 0));
    }
}
