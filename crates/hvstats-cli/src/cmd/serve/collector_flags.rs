//! `serve`'s collector flags, made from the collector table ([`COLLECTORS`]) as node_exporter
//! makes its own: `--collector.NAME` and `--no-collector.NAME` for each collector, and
//! `--collector.disable-defaults`. A name that is no collector is a usage error that lists them.

use clap::{Arg, ArgAction, ArgMatches, Command, FromArgMatches};
use hvstats_present::collectors::{COLLECTORS, Selection};

/// The flag that turns every default collector off.
const DISABLE_DEFAULTS: &str = "collector.disable-defaults";

/// The collectors `serve` exports (a scrape's `collect[]` narrows them further).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CollectorFlags {
    /// The collectors enabled.
    pub selection: Selection,
}

impl FromArgMatches for CollectorFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let flag = |id: String| m.try_get_one::<bool>(&id).ok().flatten().copied().unwrap_or(false);
        let mut selection =
            if flag(DISABLE_DEFAULTS.to_owned()) { Selection::NONE } else { Selection::defaults() };
        for c in &COLLECTORS {
            if flag(format!("collector.{}", c.name)) {
                selection = selection.with(c.collector);
            }
            if flag(format!("no-collector.{}", c.name)) {
                selection = selection.without(c.collector);
            }
        }
        Ok(Self { selection })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for CollectorFlags {
    fn augment_args(mut cmd: Command) -> Command {
        cmd = cmd.arg(
            Arg::new(DISABLE_DEFAULTS)
                .long(DISABLE_DEFAULTS)
                .action(ArgAction::SetTrue)
                .help("Turn every collector off but those --collector.NAME turns on (--no-collector.NAME turns one off)")
                .help_heading("Collectors"),
        );
        for c in &COLLECTORS {
            let default = if c.default { "on by default" } else { "off by default" };
            cmd = cmd
                .arg(
                    Arg::new(format!("collector.{}", c.name))
                        .long(format!("collector.{}", c.name))
                        .action(ArgAction::SetTrue)
                        .help(format!("Export {} ({default})", c.help))
                        .help_heading("Collectors"),
                )
                .arg(
                    Arg::new(format!("no-collector.{}", c.name))
                        .long(format!("no-collector.{}", c.name))
                        .action(ArgAction::SetTrue)
                        .help(format!("Leave out the {} collector", c.name))
                        .hide(true),
                );
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// For a usage error about `arg` (as the user typed it): the collectors there are, when `arg`
/// names a collector flag.
pub(crate) fn hint_for(arg: &str) -> Option<String> {
    let flag = arg.split('=').next().unwrap_or(arg);
    (flag.starts_with("--collector.") || flag.starts_with("--no-collector."))
        .then(|| format!("collectors: {}", hvstats_present::collectors::names()))
}
