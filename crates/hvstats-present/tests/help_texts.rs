//! The HELP text of every metric family says what its series hold: a counter is a total (its
//! rate is the reader's to take), never "the rate of" something; time halted is no handling time.

use hvstats_present::metrics::{MetricKind, families};

#[test]
fn every_counter_family_says_it_is_a_total_and_none_calls_itself_a_rate() {
    let counters: Vec<_> = families().iter().filter(|f| f.kind == MetricKind::Counter).collect();
    assert!(counters.len() > 30, "{} counter families", counters.len());
    for f in families() {
        assert!(!f.help.contains("The rate"), "{}: {}", f.name, f.help);
    }
    for f in counters {
        assert!(f.help.contains("total") || f.help.contains("Total"), "{}: {}", f.name, f.help);
    }
}

#[test]
fn the_intercept_time_family_says_hlt_time_is_time_halted() {
    let time = families().iter().find(|f| f.name == "vp_intercept").unwrap();
    assert!(time.help.contains("for hlt, the time the virtual processor spent halted"), "{}", time.help);
    assert!(time.members.iter().any(|m| m.counter.is_time_halted()));
}
