//! The state of the live view and what each key does to it.
//!
//! A key becomes an [`Action`] through the one table [`KEYS`], which also makes the help text, so
//! help and dispatch cannot drift apart; [`App::update`] applies an action; drawing is elsewhere
//! and only reads the state.

use std::time::Duration;

use crate::top::table::Shown;
use regex::Regex;

use crate::top::baseline::Baseline;
use crate::top::table::{self, Group};
use hvstats_present::live::Reading;

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Sort by the next column (after the last: by name again).
    SortNext,
    /// Sort by the previous column.
    SortPrevious,
    /// Flip the sort order.
    SortReverse,
    /// Start typing a regex the VM names must match.
    Filter,
    /// Stop or resume sampling.
    Pause,
    /// Start typing a new interval in seconds.
    Interval,
    /// Show values since now instead of over the last interval (again: restart).
    Reset,
    /// Start typing the columns to show (empty: every column, those that move first).
    Fields,
    /// Scroll the columns left.
    ScrollLeft,
    /// Scroll the columns right.
    ScrollRight,
    /// Show or hide the help.
    Help,
    /// Leave.
    Quit,
}

/// One key: its character, the action and its help text.
pub(crate) struct Key {
    /// The character typed; case matters (`o` and `O` differ).
    pub key: char,
    /// What it does.
    pub action: Action,
    /// Its line of the help, after the key (lower case, no final stop).
    pub help: &'static str,
    /// Its words in the key bar at the bottom of the screen ("" when another key's words say it).
    pub bar: &'static str,
}

/// Every key, in the order the help lists them (kvm_stat's letters where it has one).
pub(crate) const KEYS: [Key; 12] = [
    Key { key: 'o', action: Action::SortNext, help: "sort by the next column", bar: "o/O sort" },
    Key { key: 'O', action: Action::SortPrevious, help: "sort by the previous column", bar: "" },
    Key { key: 'i', action: Action::SortReverse, help: "invert the sort order", bar: "i invert" },
    Key { key: 'f', action: Action::Filter, help: "filter VMs by regex (empty: all)", bar: "f filter" },
    Key {
        key: 'F',
        action: Action::Fields,
        help: "choose the columns, e.g. Run%,IO/s (empty: all)",
        bar: "F columns",
    },
    Key {
        key: '<', action: Action::ScrollLeft, help: "scroll the columns left (also ←)", bar: "</> scroll"
    },
    Key { key: '>', action: Action::ScrollRight, help: "scroll the columns right (also →)", bar: "" },
    Key { key: 'p', action: Action::Pause, help: "pause / resume sampling", bar: "p pause" },
    Key {
        key: 's',
        action: Action::Interval,
        help: "set the sampling interval in seconds",
        bar: "s interval",
    },
    Key { key: 'r', action: Action::Reset, help: "reset: show averages since now", bar: "" },
    Key { key: 'h', action: Action::Help, help: "show / hide this help", bar: "h help" },
    Key { key: 'q', action: Action::Quit, help: "quit", bar: "q quit" },
];

/// The key bar for a screen `width` columns wide: every key's words in table order, less those
/// that do not fit, the last first; the help and quit keys always stay.
pub(crate) fn key_bar(width: usize) -> String {
    let kept = |k: &&Key| matches!(k.action, Action::Help | Action::Quit);
    let mut shown: Vec<&Key> = KEYS.iter().filter(|k| !k.bar.is_empty()).collect();
    let text = |shown: &[&Key]| shown.iter().map(|k| k.bar).collect::<Vec<_>>().join("  ");
    while text(&shown).chars().count() > width {
        match shown.iter().rposition(|k| !kept(k)) {
            Some(i) => {
                shown.remove(i);
            }
            None => break,
        }
    }
    text(&shown)
}

/// The action of key `c`, if any.
pub fn action_of(c: char) -> Option<Action> {
    KEYS.iter().find(|k| k.key == c).map(|k| k.action)
}

/// A line being typed at the bottom of the screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// A regex for [`Action::Filter`].
    Filter(String),
    /// Seconds for [`Action::Interval`].
    Interval(String),
    /// Column headers for [`Action::Fields`].
    Fields(String),
}

/// The whole state of the view.
pub struct App {
    /// The runtime directory, for the empty-screen message.
    pub(crate) dir: String,
    /// Time between readings.
    pub interval: Duration,
    /// Sampling stopped.
    pub paused: bool,
    /// Help shown.
    pub help: bool,
    /// The column sorted by (`None`: by name).
    pub(crate) sort: Option<Shown>,
    /// Largest first.
    pub(crate) descending: bool,
    /// The VM filter.
    pub filter: Option<Regex>,
    /// The columns chosen (`None`: every column, those that move first).
    pub fields: Option<Vec<Shown>>,
    /// Columns scrolled past on the left.
    pub(crate) offset: usize,
    /// A line being typed.
    pub prompt: Option<Prompt>,
    /// The last message (an invalid regex, a read error).
    pub message: Option<String>,
    /// The readings values are shown between.
    pub(crate) baseline: Baseline,
    /// Set by [`Action::Quit`].
    pub quit: bool,
}

impl App {
    /// A view of `dir` sampling every `interval`.
    pub fn new(dir: String, interval: Duration) -> Self {
        Self {
            dir,
            interval,
            paused: false,
            help: false,
            sort: None,
            descending: true,
            filter: None,
            fields: None,
            offset: 0,
            prompt: None,
            message: None,
            baseline: Baseline::default(),
            quit: false,
        }
    }

    /// Takes a new reading ([`Baseline::sample`]).
    pub fn sample(&mut self, reading: Reading) {
        // What could not be read shows in the status line; the rest is shown as usual.
        if let Some(problem) = reading.problems.first() {
            let more = reading.problems.len() - 1;
            self.message =
                Some(if more > 0 { format!("{problem} (and {more} more)") } else { problem.clone() });
        }
        self.baseline.sample(reading);
    }

    /// The groups to show: filtered and sorted.
    pub(crate) fn groups(&self) -> Vec<Group> {
        let Some((base, latest)) = self.baseline.pair() else { return Vec::new() };
        let mut groups = table::groups(base, latest);
        if let Some(filter) = &self.filter {
            groups.retain(|g| vm_matches(filter, latest, g));
        }
        for g in &mut groups {
            g.vps.sort_by(|a, b| table::compare(a, b, self.sort, self.descending));
        }
        groups.sort_by(|a, b| table::compare(&a.total, &b.total, self.sort, self.descending));
        groups
    }

    /// Applies `action`.
    pub fn update(&mut self, action: Action) {
        match action {
            // Left to right through the columns as shown, then back to names.
            Action::SortNext => {
                let mut columns = table::sortable();
                self.sort = match self.sort {
                    None => columns.next(),
                    Some(current) => columns.skip_while(|c| *c != current).nth(1),
                }
            }
            Action::SortPrevious => {
                let columns: Vec<Shown> = table::sortable().collect();
                self.sort = match self.sort {
                    None => columns.last().copied(),
                    Some(current) => columns
                        .iter()
                        .position(|c| *c == current)
                        .and_then(|at| at.checked_sub(1))
                        .map(|at| columns[at]),
                }
            }
            Action::SortReverse => self.descending = !self.descending,
            Action::Filter => {
                let current = self.filter.as_ref().map(|r| r.as_str().to_owned()).unwrap_or_default();
                self.prompt = Some(Prompt::Filter(current));
            }
            Action::Fields => {
                let current = self
                    .fields
                    .as_ref()
                    .map(|f| f.iter().map(|c| c.header()).collect::<Vec<_>>().join(","))
                    .unwrap_or_default();
                self.prompt = Some(Prompt::Fields(current));
            }
            Action::ScrollLeft => self.offset = self.offset.saturating_sub(1),
            Action::ScrollRight => {
                let columns = self.fields.as_ref().map_or_else(|| table::shown().count(), Vec::len);
                self.offset = (self.offset + 1).min(columns.saturating_sub(1));
            }
            Action::Pause => self.paused = !self.paused,
            Action::Interval => self.prompt = Some(Prompt::Interval(String::new())),
            Action::Reset => self.baseline.reset(),
            Action::Help => self.help = !self.help,
            Action::Quit => self.quit = true,
        }
    }

    /// A character typed while a prompt is open (`\n` ends it, `\x1b` cancels it, `\x08` erases).
    pub fn type_char(&mut self, c: char) {
        let Some(prompt) = &mut self.prompt else { return };
        let text = match prompt {
            Prompt::Filter(t) | Prompt::Interval(t) | Prompt::Fields(t) => t,
        };
        match c {
            '\x1b' => self.prompt = None,
            '\x08' => {
                text.pop();
            }
            '\n' => {
                let prompt = self.prompt.take();
                self.message = None;
                match prompt {
                    Some(Prompt::Filter(t)) if t.is_empty() => self.filter = None,
                    Some(Prompt::Filter(t)) => match Regex::new(&t) {
                        Ok(r) => self.filter = Some(r),
                        Err(e) => self.message = Some(invalid_regex(&t, &e)),
                    },
                    Some(Prompt::Fields(t)) if t.trim().is_empty() => self.fields = None,
                    Some(Prompt::Fields(t)) => match table::parse_fields(&t) {
                        Ok(f) => {
                            self.fields = Some(f);
                            self.offset = 0;
                        }
                        Err(e) => self.message = Some(e),
                    },
                    Some(Prompt::Interval(t)) => match t.trim().parse::<f64>() {
                        Ok(s) if (0.1..=3600.0).contains(&s) => self.interval = Duration::from_secs_f64(s),
                        _ => self.message = Some(format!("{t:?}: the interval is 0.1 to 3600 seconds")),
                    },
                    None => {}
                }
            }
            c if !c.is_control() && text.len() < 200 => text.push(c),
            _ => {}
        }
    }

    /// The key help, one line per key.
    pub(crate) fn help_lines() -> Vec<String> {
        KEYS.iter().map(|k| format!("{}  {}", k.key, k.help)).collect()
    }
}

/// A regex error on one line: the regex crate's message spans several (the pattern, a caret
/// under the fault, the reason), which a status line would run together.
fn invalid_regex(pattern: &str, e: &regex::Error) -> String {
    let text = e.to_string();
    let reason = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(&text);
    let reason = reason.trim().trim_start_matches("error: ");
    format!("invalid regex {pattern:?}: {reason}")
}

/// True when `filter` matches the VM of `group`: its name, or its platform and the platform's
/// labels in `reading` ([`platform_text`]).
pub fn vm_matches(filter: &Regex, reading: &Reading, group: &Group) -> bool {
    filter.is_match(&group.vm) || filter.is_match(&platform_text(reading, group))
}

/// What the VM filter matches besides the VM's name: its platform and the platform's labels,
/// `platform=kubevirt namespace=default name=testvm …` (empty for a VM with none).
fn platform_text(reading: &Reading, group: &Group) -> String {
    let Some(shown) = reading.platform(&group.instance, group.partition) else { return String::new() };
    let labels = shown.labels.iter().map(|(name, value)| format!(" {name}={value}"));
    format!("platform={}", shown.platform) + &labels.collect::<String>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_bar_keeps_help_and_quit_at_any_width() {
        let wide = super::key_bar(200);
        assert_eq!(
            wide,
            "o/O sort  i invert  f filter  F columns  </> scroll  p pause  s interval  h help  q quit"
        );
        for width in [80, 60, 40, 10] {
            let bar = super::key_bar(width);
            assert!(bar.ends_with("h help  q quit"), "{width}: {bar}");
            assert!(bar.chars().count() <= width.max("h help  q quit".len()), "{width}: {bar}");
        }
        let bar = super::key_bar(80);
        assert!(bar.starts_with("o/O sort  i invert  f filter"), "{bar}");
        // Every key the bar names is a key of the table.
        for word in wide.split("  ") {
            let key = word.chars().next().unwrap();
            assert!(super::action_of(key).is_some(), "{word}");
        }
    }

    use super::*;

    #[test]
    fn every_key_has_one_action_and_every_action_a_key() {
        for (i, k) in KEYS.iter().enumerate() {
            assert!(KEYS[..i].iter().all(|o| o.key != k.key && o.action != k.action), "{}", k.key);
            assert_eq!(action_of(k.key), Some(k.action));
        }
        assert_eq!(action_of('z'), None);
    }

    #[test]
    fn sorting_cycles_through_every_column_as_shown_and_back_to_names() {
        let mut app = App::new(String::new(), Duration::from_secs(1));
        // Run%, Exits/s, Wait%, p50, p99 (the class is a name, not sorted by), then every other
        // column.
        let order: Vec<Shown> = table::sortable().collect();
        assert_eq!(
            order[..5],
            [Shown::Presented(0), Shown::Presented(1), Shown::WaitPercent, Shown::P50, Shown::P99]
        );
        assert_eq!(order.len(), 3 + hvstats_present::present::VP_COLUMNS.len());
        for expected in order.iter().copied().map(Some).chain([None]) {
            app.update(Action::SortNext);
            assert_eq!(app.sort, expected);
        }
        app.update(Action::SortPrevious);
        assert_eq!(app.sort, order.last().copied());
        app.update(Action::SortPrevious);
        assert_eq!(app.sort, order.get(order.len() - 2).copied());
        app.sort = Some(order[0]);
        app.update(Action::SortPrevious);
        assert_eq!(app.sort, None);
    }

    #[test]
    fn the_vm_filter_matches_a_vms_platform_labels_too() {
        let before = Reading::of(vec![hvstats_testkit::synthetic_instance(2, 1)]);
        let mut after = before.clone();
        let text = "2\tplatform\topenstack\n2\tsource\tlibvirt-metadata\n2\tlabel.project_name\tshop\n";
        after.platforms.insert("4242-1-0".to_owned(), hvstats_platform::shown::decode(text));
        let mut app = App::new(String::new(), Duration::from_secs(1));
        app.sample(before);
        app.sample(after);
        app.filter = Some(Regex::new("project_name=shop").unwrap());
        let shown: Vec<u64> = app.groups().iter().map(|g| g.partition).collect();
        assert_eq!(shown, [2]);
        app.filter = Some(Regex::new("^platform=openstack").unwrap());
        assert_eq!(app.groups().len(), 1);
    }

    #[test]
    fn prompts_set_the_filter_and_interval_or_say_what_is_wrong() {
        let mut app = App::new(String::new(), Duration::from_secs(1));
        app.update(Action::Filter);
        "vm[".chars().chain(['\n']).for_each(|c| app.type_char(c));
        assert!(app.filter.is_none());
        assert!(app.message.as_deref().unwrap().starts_with("invalid regex"));
        app.update(Action::Filter);
        ":7$\n".chars().for_each(|c| app.type_char(c));
        assert_eq!(app.filter.as_ref().map(Regex::as_str), Some(":7$"));
        app.update(Action::Interval);
        "2.5\n".chars().for_each(|c| app.type_char(c));
        assert_eq!(app.interval, Duration::from_millis(2500));
        app.update(Action::Interval);
        "0\n".chars().for_each(|c| app.type_char(c));
        assert_eq!(app.interval, Duration::from_millis(2500));
        assert!(app.message.is_some());
    }

    #[test]
    fn columns_are_chosen_by_their_headers_as_typed_or_the_error_lists_them() {
        let fields = table::parse_fields("run%, IO/s ,hcall us,Hcall µs").unwrap();
        let headers: Vec<String> = fields.iter().map(|c| c.header()).collect();
        assert_eq!(headers, ["Run%", "IO/s", "Hcall µs"]);
        let e = table::parse_fields("Run%,MSR cost").unwrap_err();
        assert!(e.starts_with("no column \"MSR cost\"") && e.contains("MSR µs"), "{e}");
        assert!(table::parse_fields(" , ").is_err());
        let mut app = App::new(String::new(), Duration::from_secs(1));
        app.update(Action::Fields);
        "IO/s,CPUID/s\n".chars().for_each(|c| app.type_char(c));
        assert_eq!(app.fields.as_ref().map(Vec::len), Some(2));
        app.update(Action::ScrollRight);
        app.update(Action::ScrollRight);
        assert_eq!(app.offset, 1, "scrolling stops at the last column");
        app.update(Action::ScrollLeft);
        app.update(Action::ScrollLeft);
        assert_eq!(app.offset, 0);
        app.update(Action::Fields);
        "\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\n".chars().for_each(|c| app.type_char(c));
        assert_eq!(app.fields, None, "empty: every column again");
    }

    #[test]
    fn an_invalid_filter_is_reported_on_one_line() {
        let mut app = App::new(String::new(), Duration::from_secs(1));
        app.update(Action::Filter);
        "(vm\n".chars().for_each(|c| app.type_char(c));
        let message = app.message.unwrap();
        assert!(!message.contains('\n'), "{message}");
        assert_eq!(message, "invalid regex \"(vm\": unclosed group");
    }
}
