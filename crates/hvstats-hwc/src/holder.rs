//! Who holds an allocation, and whether that process still exists.
//!
//! A record names its process by pid and by the process's start time (field 22 of
//! `/proc/<pid>/stat`, in clock ticks since boot), so a pid reused by a later process is not
//! mistaken for the holder. A process that has exited (or is a zombie) no longer holds anything.
//! An allocation made "until freed" (an operator's `hvstats hwc alloc`) outlives its process.
//! Pids are those of the reader's pid namespace: every consumer of one table must share it.

use std::io;

use serde::{Deserialize, Serialize};

/// The process that holds an allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The holder's pid, in the pid namespace every user of the table shares.
    pub pid: u32,
    /// The process's start time (clock ticks after boot), from `/proc/<pid>/stat` field 22.
    pub start_time: u64,
    /// The process's name (`comm`), for people reading the table.
    pub name: String,
    /// Held until freed, whether or not the process lives on.
    pub persistent: bool,
}

/// The state letter and start time of a live process, from `/proc/<pid>/stat`.
pub(crate) fn process_stat(pid: u32) -> Option<(char, u64, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let stat = hvstats_host::task_stat::StatLine::parse(&text)?;
    let (state, start, name) = (stat.state()?, stat.start_time()?, stat.comm().to_owned());
    Some((state, start, name))
}

impl Holder {
    /// The calling process.
    ///
    /// # Errors
    /// When `/proc/self/stat` cannot be read or parsed.
    pub fn current(persistent: bool) -> io::Result<Self> {
        let pid = std::process::id();
        let (_, start_time, name) = process_stat(pid).ok_or_else(|| {
            io::Error::other(format!("cannot read the start time of process {pid} from /proc"))
        })?;
        Ok(Self { pid, start_time, name, persistent })
    }

    /// Whether the holder still holds: persistent, or its process runs (same pid, same start time,
    /// not a zombie).
    pub fn is_alive(&self) -> bool {
        self.persistent || self.process_runs()
    }

    /// Whether the process that made the allocation still runs.
    pub fn process_runs(&self) -> bool {
        matches!(process_stat(self.pid), Some((state, start, _))
            if start == self.start_time && state != 'Z' && state != 'X')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_process_is_alive_and_a_reused_pid_is_not() {
        let me = Holder::current(false).unwrap();
        assert!(me.is_alive());
        assert!(!Holder { start_time: me.start_time + 1, ..me.clone() }.is_alive());
        assert!(Holder { start_time: me.start_time + 1, persistent: true, ..me.clone() }.is_alive());
        // Pid 0 never has a /proc entry.
        assert!(!Holder { pid: 0, ..me }.is_alive());
    }

    #[test]
    fn a_killed_child_is_dead_even_before_it_is_reaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let (_, start_time, name) = process_stat(pid).unwrap();
        let h = Holder { pid, start_time, name, persistent: false };
        assert!(h.is_alive());
        child.kill().unwrap();
        // A zombie until reaped: it already holds nothing.
        while process_stat(pid).is_some_and(|s| s.0 != 'Z') {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!h.is_alive());
        child.wait().unwrap();
        assert!(!h.is_alive());
    }
}
