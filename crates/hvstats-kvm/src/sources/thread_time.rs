//! A VP thread's CPU time and guest time, from procfs.
//!
//! Total run time is the thread's scheduler run time (`schedstat`, ns). Guest time is field 43 of
//! `stat` (clock ticks): on VMX/SVM hosts it grows while the guest runs; under KVM's instruction
//! emulator it stays 0 and all of the VP's time is hypervisor time.

use std::io;

/// 100 ns units per second.
const UNITS_PER_SEC: u64 = 10_000_000;

/// One reading of a thread's times, in 100 ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    /// CPU time of the thread.
    pub total_100ns: u64,
    /// Guest time of the thread (0 under instruction emulation).
    pub guest_100ns: u64,
}

impl ThreadTimes {
    /// Time outside the guest: total less guest time.
    pub fn hypervisor_100ns(self) -> u64 {
        self.total_100ns.saturating_sub(self.guest_100ns)
    }
}

/// Reads the times of thread `tid` of this process.
///
/// # Errors
/// When procfs cannot be read or parsed.
pub fn read(tid: libc::pid_t) -> io::Result<ThreadTimes> {
    let schedstat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
    let run_ns: u64 = schedstat
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable schedstat"))?;
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    let guest_ticks = parse_guest_ticks(&stat)?;
    Ok(ThreadTimes { total_100ns: run_ns / 100, guest_100ns: guest_ticks * (UNITS_PER_SEC / clock_ticks()) })
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Field 43 (guest_time) of a `stat` line; the command name (field 2) may contain spaces and
/// parentheses, so fields are counted after its closing parenthesis.
fn parse_guest_ticks(stat: &str) -> io::Result<u64> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unparsable stat");
    let rest = &stat[stat.rfind(')').ok_or_else(bad)? + 1..];
    // After ")" comes field 3; field 43 is the 41st one.
    rest.split_whitespace().nth(40).and_then(|v| v.parse().ok()).ok_or_else(bad)
}

/// The calling thread's id.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_time_is_field_43_even_with_a_strange_command_name() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[43 - 3] = "777".into();
        let line = format!("123 (a) b (c) {}", fields.join(" "));
        assert_eq!(parse_guest_ticks(&line).unwrap(), 777);
        assert!(parse_guest_ticks("garbage").is_err());
    }

    #[test]
    fn own_thread_times_are_readable() {
        let t = read(gettid()).unwrap();
        assert!(t.total_100ns > 0);
        assert!(t.hypervisor_100ns() <= t.total_100ns);
    }
}
