//! `hvstats top`: a live full-screen view of every VP of every live instance, in kvm_stat's
//! spirit — one row per VP under its partition's total, columns of the main intercept classes
//! presented as the catalog says (run time %, rates per second, average cost in µs).
//!
//! `--once` prints one text table (or `--json`) from two readings one interval apart, for scripts
//! and terminals that are not one.

use std::io::{IsTerminal, Write};

use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use hvstats_present::live::{Live, Reading};
use hvstats_surfaces::top::app::{self, App};
use hvstats_surfaces::top::table;

/// Flags of `hvstats top`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The runtime directory the instances are published under (default: $HVSTATS_RUNTIME_DIR,
    /// or /run/hvstats).
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// Seconds between readings.
    #[arg(long, short = 'd', value_name = "SECS", default_value_t = 1.0, value_parser = parse_interval)]
    interval: f64,
    /// Print one table from two readings one interval apart, and exit.
    #[arg(long)]
    once: bool,
    /// With --once: print JSON instead of a table.
    #[arg(long, requires = "once")]
    json: bool,
    /// The columns to show, by their headers, e.g. `Run%,Wait%,IO/s,CPUID/s,Hcall us` (default:
    /// every column, those that move first; `F` changes them in the live view).
    #[arg(long, value_name = "LIST", value_parser = table::parse_fields_flag)]
    fields: Option<table::Fields>,
    /// Only the VMs whose name, or whose platform's labels, match this regex (as `f` does in the
    /// live view, where it can be changed), e.g. `--vm web-1`, `--vm '^db-'` or
    /// `--vm project_name=shop` (docs/platforms/).
    #[arg(long, value_name = "REGEX")]
    vm: Option<regex::Regex>,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    crate::cmd::seconds_in(s, 0.1, 3600.0)
}

/// Runs `hvstats top`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let live = Live::new(Some(crate::cmd::runtime_dir(args.runtime_dir)?));
    if args.once {
        let fields = args.fields.as_ref().map(|f| f.0.as_slice());
        return once(&live, args.interval, args.json, fields, args.vm.as_ref());
    }
    let mut app = App::new(live.dir().display().to_string(), Duration::from_secs_f64(args.interval));
    app.fields = args.fields.map(|f| f.0);
    app.filter = args.vm;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!("the live view needs a terminal; for a table or JSON, use --once [--json]");
    }
    let mut terminal = ratatui::try_init().context("setting up the terminal")?;
    let result = event_loop(&mut terminal, live, &mut app);
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

/// One table (or JSON) from two readings; exit status 1 when something could not be read, as
/// `snapshot` does (what could be read is still printed).
fn once(
    live: &Live,
    interval: f64,
    json: bool,
    fields: Option<&[table::Shown]>,
    vm: Option<&regex::Regex>,
) -> anyhow::Result<ExitCode> {
    let before = live.read()?;
    std::thread::sleep(Duration::from_secs_f64(interval));
    let after = live.read()?;
    if after.instances.is_empty() && after.problems.is_empty() {
        return nothing_published(live.dir(), json);
    }
    let seconds = after.at.saturating_duration_since(before.at).as_secs_f64();
    let mut groups = table::groups(&before, &after);
    let mut unmatched = None;
    if let Some(vm) = vm {
        let all: Vec<String> = groups.iter().map(|g| g.vm.clone()).collect();
        groups.retain(|g| app::vm_matches(vm, &after, g));
        if groups.is_empty() && !all.is_empty() {
            unmatched = Some(no_vm_matches(vm, &all));
        }
    }
    if let Some(line) = unmatched {
        if json {
            let _ = writeln!(std::io::stderr(), "hvstats: {line}");
        } else {
            crate::output::print(&format!("{line}\n"))?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    for problem in &after.problems {
        // A closed stderr loses the remark, not the table.
        let _ = writeln!(std::io::stderr(), "hvstats: {problem}");
    }
    // Through the shared output path: a closed pipe ends quietly, a full device is an error.
    if json {
        crate::output::print_json(&table::json(&groups, seconds), true)?;
    } else {
        crate::output::print(&table::text(&groups, seconds, &live.dir().display().to_string(), fields))?;
    }
    let failed = !before.problems.is_empty() || !after.problems.is_empty();
    Ok(if failed { crate::output::ExitStatus::RuntimeError.into() } else { ExitCode::SUCCESS })
}

/// No instance under `dir`: says so and how to start one (on standard error beside an empty JSON
/// table), with the status `snapshot` gives the same state.
fn nothing_published(dir: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let line = hvstats_surfaces::nothing_publishes(dir);
    if json {
        crate::output::print_json(&table::json(&[], 0.0), true)?;
        let _ = writeln!(std::io::stderr(), "hvstats: {line}");
    } else {
        crate::output::print(&format!("{line}\n"))?;
    }
    Ok(crate::output::ExitStatus::NothingPublished.into())
}

/// The VMs `--vm` names at most: the rest are counted.
const VMS_LISTED: usize = 20;

/// What to say when `--vm` matches none of the live VMs `all`: the regex, and the VMs there are
/// (at most [`VMS_LISTED`], each name cut as a log cuts it).
fn no_vm_matches(vm: &regex::Regex, all: &[String]) -> String {
    let listed: Vec<String> = all
        .iter()
        .take(VMS_LISTED)
        .map(|n| format!("\"{}\"", hvstats_present::text::LoggedName(n)))
        .collect();
    let more = match all.len().saturating_sub(VMS_LISTED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "no VM matches --vm {}: the live VMs are {}{more}",
        hvstats_present::text::Escaped(vm.as_str()),
        listed.join(", ")
    )
}

/// Reads every interval on its own thread, so a slow read never holds up keys or drawing.
struct Sampler {
    readings: mpsc::Receiver<anyhow::Result<Reading>>,
    interval_ms: Arc<AtomicU64>,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    fn start(live: Live, interval: Duration) -> Self {
        let (tx, readings) = mpsc::channel();
        let interval_ms = Arc::new(AtomicU64::new(interval.as_millis() as u64));
        let (paused, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (ms, p, s) = (interval_ms.clone(), paused.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last: Option<Instant> = None;
            while !s.load(Ordering::Relaxed) {
                let due =
                    last.is_none_or(|t| t.elapsed() >= Duration::from_millis(ms.load(Ordering::Relaxed)));
                if due && !p.load(Ordering::Relaxed) {
                    last = Some(Instant::now());
                    if tx.send(live.read().map_err(anyhow::Error::from)).is_err() {
                        return;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self { readings, interval_ms, paused, stop }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn event_loop(terminal: &mut ratatui::DefaultTerminal, live: Live, app: &mut App) -> anyhow::Result<()> {
    let sampler = Sampler::start(live, app.interval);
    loop {
        while let Ok(reading) = sampler.readings.try_recv() {
            match reading {
                Ok(reading) => app.sample(reading),
                Err(e) => app.message = Some(format!("{e:#}")),
            }
        }
        terminal.draw(|frame| frame.render_widget(&*app, frame.area()))?;
        if !event::poll(Duration::from_millis(100))? {
            continue;
        }
        match event::read()? {
            Event::Key(key) if key.kind == KeyEventKind::Press => {
                if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
                    return Ok(());
                }
                if app.prompt.is_some() {
                    match key.code {
                        KeyCode::Enter => app.type_char('\n'),
                        KeyCode::Esc => app.type_char('\x1b'),
                        KeyCode::Backspace => app.type_char('\x08'),
                        KeyCode::Char(c) => app.type_char(c),
                        _ => {}
                    }
                } else if key.code == KeyCode::Esc && app.help {
                    app.help = false;
                } else if key.code == KeyCode::Left {
                    app.update(app::Action::ScrollLeft);
                } else if key.code == KeyCode::Right {
                    app.update(app::Action::ScrollRight);
                } else if let KeyCode::Char(c) = key.code
                    && let Some(action) = app::action_of(c)
                {
                    app.update(action);
                }
                sampler.interval_ms.store(app.interval.as_millis() as u64, Ordering::Relaxed);
                sampler.paused.store(app.paused, Ordering::Relaxed);
                if app.quit {
                    return Ok(());
                }
            }
            // A resize redraws at the new size on the next turn.
            _ => {}
        }
    }
}
