//! Several counting perf events on one thread, read with one system call.
//!
//! Both of the KVM backend's per-thread users open a list of events on a thread this way: a VP of
//! our own partitions (its `kvm:*` tracepoints) and each thread of an observed VMM (the
//! tracepoints not counted in the kernel, and the software events). The first event that opens
//! leads the group; the others join it, so one `read` of the leader gives every value, tagged by
//! the kernel's event id. An event the group cannot take, or whose id cannot be learnt, is counted
//! alone; an event that cannot be opened, or whose filter the kernel rejects (it would count every
//! firing), is not counted and keeps the reason.

use std::io;

use crate::perf_event::PerfCounter;

/// One event to count: a perf (type, config) and, for a tracepoint, an ftrace filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventAttr<'a> {
    /// `PERF_TYPE_*` ([`crate::perf_event::TYPE_TRACEPOINT`], ...).
    pub type_: u32,
    /// The event within its type (a tracepoint's id, a `PERF_COUNT_SW_*`).
    pub config: u64,
    /// An ftrace filter narrowing a tracepoint (`reason == 2`).
    pub filter: Option<&'a str>,
}

/// Why one event of a group is not counted.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The caller did not ask for it (it is counted elsewhere, or could not be resolved).
    #[error("not opened as a perf counter")]
    NotAsked,
    /// `perf_event_open` refused it.
    #[error("perf_event_open")]
    Open(#[source] io::Error),
    /// The kernel rejected its filter.
    #[error("filter {filter:?}")]
    Filter {
        /// The filter (boxed: every place of every thread's list holds an outcome).
        filter: Box<str>,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// An open event: in the group (found in a group read by its id), or alone.
#[derive(Debug)]
enum Member {
    Grouped { counter: PerfCounter, id: u64 },
    Alone(PerfCounter),
}

impl Member {
    fn counter(&self) -> &PerfCounter {
        match self {
            Member::Grouped { counter, .. } | Member::Alone(counter) => counter,
        }
    }
}

/// A list of events counted on one thread, grouped where possible.
///
/// Only the events opened are held (where the kernel counts most of a list, a thread holds one
/// or two of its places), so a thread costs what it counts, not the length of the list.
#[derive(Debug)]
pub struct PerfGroup {
    /// The open events with their places in the caller's list, in the list's order.
    members: Vec<(usize, Member)>,
    /// Places in the caller's list (asked for or not).
    len: usize,
    /// Index in `members` of the group leader, if any event opened in the group.
    leader: Option<usize>,
    /// `{ nr, { value, id }[nr] }` of a group read.
    scratch: Vec<u64>,
}

impl PerfGroup {
    /// Opens `events` on thread `tid`, in order; `None` leaves that place empty
    /// ([`MemberError::NotAsked`]) so indices stay those of the caller's list. Returns the group
    /// and, by place, why an event is not counted.
    pub fn open<'a>(
        tid: libc::pid_t,
        events: impl IntoIterator<Item = Option<EventAttr<'a>>>,
    ) -> (Self, Vec<Result<(), MemberError>>) {
        let events = events.into_iter();
        let mut members: Vec<(usize, Member)> = Vec::new();
        let mut outcomes = Vec::with_capacity(events.size_hint().0);
        let mut leader: Option<usize> = None;
        for (place, event) in events.enumerate() {
            let opened = match event {
                None => Err(MemberError::NotAsked),
                Some(attr) => open_member(attr, tid, leader.map(|i| members[i].1.counter())),
            };
            if leader.is_none() && matches!(opened, Ok(Member::Grouped { .. })) {
                leader = Some(members.len());
            }
            outcomes.push(opened.map(|m| members.push((place, m))));
        }
        members.shrink_to_fit();
        outcomes.shrink_to_fit();
        let grouped = members.iter().filter(|(_, m)| matches!(m, Member::Grouped { .. })).count();
        // Nothing to read through when nothing is grouped (a thread counted in the kernel).
        let scratch = if grouped == 0 { Vec::new() } else { vec![0; 1 + 2 * grouped] };
        (Self { members, len: outcomes.len(), leader, scratch }, outcomes)
    }

    /// Number of places (asked for or not).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the list was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when event `i` is counted.
    pub fn is_open(&self, i: usize) -> bool {
        self.members.binary_search_by_key(&i, |(place, _)| *place).is_ok()
    }

    /// Perf descriptors held.
    pub fn fds(&self) -> usize {
        self.members.len()
    }

    /// Reads every event now: the group with one `read`, plus each event counted alone. `out[i]`
    /// is set to event `i`'s value where it was read and to `None` where it was not (not
    /// counted, or the read failed); `out` shorter than the list reads only its part.
    pub fn read_into(&mut self, out: &mut [Option<u64>]) {
        let words = match self.leader.and_then(|i| self.members.get(i)) {
            Some((_, leader)) => leader.counter().read_group(&mut self.scratch).unwrap_or(0),
            None => 0,
        };
        // The pairs actually returned.
        let nr = (self.scratch.first().copied().unwrap_or(0) as usize).min(words.saturating_sub(1) / 2);
        let pairs = self.scratch.get(1..1 + 2 * nr).unwrap_or(&[]);
        out.iter_mut().take(self.len).for_each(|v| *v = None);
        for (place, member) in &self.members {
            let Some(value) = out.get_mut(*place) else { break };
            *value = match member {
                Member::Grouped { id, .. } => pairs.chunks_exact(2).find(|p| p[1] == *id).map(|p| p[0]),
                Member::Alone(c) => c.read().ok(),
            };
        }
    }

    /// Every value now, as [`read_into`](Self::read_into).
    pub fn read(&mut self) -> Vec<Option<u64>> {
        let mut out = vec![None; self.len];
        self.read_into(&mut out);
        out
    }
}

fn open_member(
    attr: EventAttr<'_>,
    tid: libc::pid_t,
    leader: Option<&PerfCounter>,
) -> Result<Member, MemberError> {
    let alone = || PerfCounter::open(attr.type_, attr.config, tid).map_err(MemberError::Open);
    let member = match PerfCounter::open_in_group(attr.type_, attr.config, tid, leader) {
        Ok(c) => match c.id() {
            Ok(id) => Member::Grouped { counter: c, id },
            // Without its id its value cannot be found in a group read: count it alone.
            Err(_) => Member::Alone(alone()?),
        },
        // A group that cannot take it: count it alone.
        Err(_) if leader.is_some() => Member::Alone(alone()?),
        Err(e) => return Err(MemberError::Open(e)),
    };
    if let Some(filter) = attr.filter
        && let Err(source) = member.counter().set_filter(filter)
    {
        return Err(MemberError::Filter { filter: filter.into(), source });
    }
    Ok(member)
}

// An outcome is kept for every place of every counted thread's list.
const _: () = assert!(size_of::<Result<(), MemberError>>() <= 32);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf_event::{SW_CPU_MIGRATIONS, SW_TASK_CLOCK, TYPE_SOFTWARE};

    fn gettid() -> libc::pid_t {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::gettid() }
    }

    #[test]
    fn a_group_reads_each_member_and_leaves_unasked_places_empty() {
        let clock = EventAttr { type_: TYPE_SOFTWARE, config: SW_TASK_CLOCK, filter: None };
        let migrations = EventAttr { type_: TYPE_SOFTWARE, config: SW_CPU_MIGRATIONS, filter: None };
        let (mut group, outcomes) = PerfGroup::open(gettid(), [Some(clock), None, Some(migrations)]);
        if let Err(e) = &outcomes[0] {
            eprintln!("skipped: perf refuses software events here: {e}");
            return;
        }
        assert_eq!(group.len(), 3);
        assert_eq!(group.fds(), 2);
        assert!(matches!(outcomes[1], Err(MemberError::NotAsked)));
        assert!(group.is_open(2) && !group.is_open(1));
        let first = group.read();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(3) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let second = group.read();
        assert_eq!(first[1], None);
        assert!(second[0] > first[0], "{first:?} then {second:?}: the task clock moves");
        assert!(second[2].is_some());
    }

    #[test]
    fn a_long_list_of_which_two_places_are_asked_reads_those_two_at_their_places() {
        let clock = EventAttr { type_: TYPE_SOFTWARE, config: SW_TASK_CLOCK, filter: None };
        let migrations = EventAttr { type_: TYPE_SOFTWARE, config: SW_CPU_MIGRATIONS, filter: None };
        let places = (0..64).map(|i| match i {
            10 => Some(clock),
            50 => Some(migrations),
            _ => None,
        });
        let (mut group, outcomes) = PerfGroup::open(gettid(), places);
        if let Err(e) = &outcomes[10] {
            eprintln!("skipped: perf refuses software events here: {e}");
            return;
        }
        assert_eq!((group.len(), outcomes.len(), group.fds()), (64, 64, 2));
        assert!(group.is_open(10) && group.is_open(50) && !group.is_open(11) && !group.is_open(64));
        let values = group.read();
        let read: Vec<usize> = (0..64).filter(|&i| values[i].is_some()).collect();
        assert_eq!(read, [10, 50], "{values:?}");
        // A shorter reading fills only its part, and sets the places it holds that are not read.
        let mut short = [Some(7); 20];
        group.read_into(&mut short);
        assert!(short[10].is_some() && short.iter().enumerate().all(|(i, v)| i == 10 || v.is_none()));
    }

    #[test]
    fn a_rejected_filter_drops_the_event_instead_of_counting_everything() {
        // A software event has no filter: the kernel rejects setting one.
        let bad = EventAttr { type_: TYPE_SOFTWARE, config: SW_TASK_CLOCK, filter: Some("x == 1") };
        let (group, outcomes) = PerfGroup::open(gettid(), [Some(bad)]);
        match &outcomes[0] {
            Err(MemberError::Filter { .. }) => {}
            Err(MemberError::Open(e)) => eprintln!("skipped: perf refuses software events here: {e}"),
            other => panic!("a filter on a software event was accepted: {other:?}"),
        }
        assert_eq!(group.fds(), 0);
    }
}
