//! Logical processors: which host CPUs an instance has LP objects for.
//!
//! Each online host CPU is one logical processor object (seed 001: "the number of logical
//! processor objects matches the number of logical processors in the computer"). LP index `n` is
//! the `n`-th online CPU.

use std::io;

/// The online host CPUs, from `/sys/devices/system/cpu/online`, or `0..available_parallelism`
/// when that file cannot be read.
pub fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s).ok())
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as u32).collect()
        })
}

/// Parses a kernel CPU list such as `0-3,5,8-9`.
///
/// # Errors
/// `InvalidData` on anything else.
pub fn parse_cpu_list(text: &str) -> io::Result<Vec<u32>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("not a CPU list: {text:?}"));
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 1 << 16 {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_with_ranges_and_singles() {
        assert_eq!(parse_cpu_list("0-3,5,8-9\n").unwrap(), vec![0, 1, 2, 3, 5, 8, 9]);
        assert_eq!(parse_cpu_list("0\n").unwrap(), vec![0]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
    }

    #[test]
    fn this_host_has_an_online_cpu() {
        assert!(!online_cpus().is_empty());
    }
}
