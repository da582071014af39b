//! `hvstats top`: a live full-screen view of every VP of every live instance, in kvm_stat's
//! spirit — one row per VP under its partition's total, columns of the main intercept classes
//! presented as the catalog says (run time %, rates per second, average cost in µs).
//!
//! `--once` prints one text table (or `--json`) from two readings one interval apart, for scripts
//! and terminals that are not one.

pub mod app;
pub mod table;
pub mod ui;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::cmd::live::Live;
use app::App;

/// Flags of `hvstats top`.
#[derive(clap::Args, Debug)]
pub struct Args {
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
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: the interval is a number of seconds from 0.1 to 3600")),
    }
}

/// Runs `hvstats top`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let live = Live::new(args.runtime_dir);
    if !live.dir().exists() {
        anyhow::bail!("runtime directory {} does not exist", live.dir().display());
    }
    if args.once {
        return once(&live, args.interval, args.json);
    }
    let mut app = App::new(live.dir().display().to_string(), Duration::from_secs_f64(args.interval));
    let mut terminal = ratatui::init();
    let result = event_loop(&mut terminal, &live, &mut app);
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

fn once(live: &Live, interval: f64, json: bool) -> anyhow::Result<ExitCode> {
    let before = live.read()?;
    std::thread::sleep(Duration::from_secs_f64(interval));
    let after = live.read()?;
    let seconds = after.at.saturating_duration_since(before.at).as_secs_f64();
    let groups = table::groups(&before, &after);
    let mut out = std::io::stdout().lock();
    for problem in &after.problems {
        // A closed stderr loses the remark, not the table.
        let _ = writeln!(std::io::stderr(), "hvstats: {problem}");
    }
    if json {
        serde_json::to_writer_pretty(&mut out, &table::json(&groups, seconds))?;
        writeln!(out)?;
    } else {
        out.write_all(table::text(&groups, seconds, &live.dir().display().to_string()).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn event_loop(terminal: &mut ratatui::DefaultTerminal, live: &Live, app: &mut App) -> anyhow::Result<()> {
    let mut next_sample = Instant::now();
    loop {
        if !app.paused && Instant::now() >= next_sample {
            match live.read() {
                Ok(reading) => app.sample(reading),
                Err(e) => app.message = Some(format!("{e:#}")),
            }
            next_sample = Instant::now() + app.interval;
        }
        terminal.draw(|frame| frame.render_widget(&*app, frame.area()))?;
        let wait = if app.paused {
            Duration::from_millis(250)
        } else {
            next_sample.saturating_duration_since(Instant::now())
        };
        if !event::poll(wait)? {
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
                    if app.prompt.is_none() {
                        // A new interval takes effect now.
                        next_sample = next_sample.min(Instant::now() + app.interval);
                    }
                } else if key.code == KeyCode::Esc && app.help {
                    app.help = false;
                } else if let KeyCode::Char(c) = key.code {
                    if let Some(action) = app::action_of(c) {
                        app.update(action);
                    }
                }
                if app.quit {
                    return Ok(());
                }
            }
            // A resize redraws at the new size on the next turn.
            _ => {}
        }
    }
}
