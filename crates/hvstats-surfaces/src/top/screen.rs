//! Drawing the live view: a title line, the table (as many columns as the width allows), and a
//! status line with the keys, a prompt or a message; the help over it on request. Drawing only
//! reads the [`App`].

use hvstats_present::text::Escaped;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Widget};

use super::app::{App, Prompt};
use crate::top::table::{self, LABEL_WIDTH, Shown};

/// How many of `columns` fit in `width` cells, at least one.
fn columns_that_fit(columns: &[Shown], width: u16) -> usize {
    let mut used = LABEL_WIDTH;
    let mut n = 0;
    for c in columns {
        used += 1 + c.width();
        if used > width as usize {
            break;
        }
        n += 1;
    }
    n.max(1)
}

impl App {
    fn title(&self) -> Line<'_> {
        let window = match (self.baseline.seconds(), self.baseline.since_reset()) {
            (Some(s), true) => format!("since reset {s:.1} s"),
            (Some(s), false) => format!("over {s:.1} s"),
            (None, _) => "first reading…".into(),
        };
        let sort = match self.sort {
            Some(c) => format!("sort {}{}", c.header(), if self.descending { "↓" } else { "↑" }),
            None => "sort name".into(),
        };
        let filter = self.filter.as_ref().map(|f| format!("  filter /{}/", f.as_str())).unwrap_or_default();
        let paused = if self.paused { "  PAUSED" } else { "" };
        Line::from(format!(
            "hvstats top — {window}, every {:.1} s  {sort}{filter}{paused}",
            self.interval.as_secs_f64()
        ))
        .style(Style::new().add_modifier(Modifier::BOLD))
    }

    fn status(&self, width: u16) -> Line<'_> {
        match (&self.prompt, &self.message) {
            (Some(Prompt::Filter(t)), _) => {
                Line::from(format!("filter regex: {t}▏ (Enter: apply, Esc: cancel)"))
            }
            (Some(Prompt::Interval(t)), _) => Line::from(format!("interval in seconds: {t}▏ (Enter, Esc)")),
            (Some(Prompt::Fields(t)), _) => {
                Line::from(format!("columns (Run%,IO/s,…; empty: all): {t}▏ (Enter, Esc)"))
            }
            (None, Some(m)) => Line::from(m.as_str()).style(Style::new().add_modifier(Modifier::REVERSED)),
            (None, None) => Line::from(super::app::key_bar(width as usize)),
        }
    }

    fn table(&self, area: Rect, buf: &mut Buffer) {
        let groups = self.groups();
        if groups.is_empty() {
            let text = match self.baseline.latest() {
                Some(r) if r.instances.is_empty() => {
                    crate::nothing_publishes(std::path::Path::new(&self.dir))
                }
                Some(_) if self.filter.is_some() => "no VM matches the filter".to_owned(),
                Some(_) if self.baseline.pair().is_some() => "no partition in the live instances".to_owned(),
                _ => "reading…".to_owned(),
            };
            Paragraph::new(text).render(area, buf);
            return;
        }
        let columns = table::columns(&groups, self.fields.as_deref());
        let offset = self.offset.min(columns.len().saturating_sub(1));
        let columns = &columns[offset..];
        let shown: Vec<Shown> = columns[..columns_that_fit(columns, area.width).min(columns.len())].to_vec();
        let header = Row::new(
            std::iter::once("VM / VP".to_owned())
                .chain(shown.iter().map(|c| format!("{:>w$}", c.header(), w = c.width()))),
        )
        .style(Style::new().add_modifier(Modifier::REVERSED));
        let line = |r: &table::Row, indent: &str| {
            std::iter::once(format!("{indent}{}", Escaped(&r.label)))
                .chain(shown.iter().map(|c| format!("{:>w$}", c.cell(r), w = c.width())))
                .collect::<Vec<_>>()
        };
        let mut rows = Vec::new();
        for g in &groups {
            let mut total = line(&g.total, "");
            if !g.active {
                total[0].push_str(" (stopped)");
            }
            rows.push(Row::new(total).style(Style::new().add_modifier(Modifier::BOLD)));
            rows.extend(g.vps.iter().map(|vp| Row::new(line(vp, "  "))));
        }
        let widths = std::iter::once(Constraint::Length(LABEL_WIDTH as u16))
            .chain(shown.iter().map(|c| Constraint::Length(c.width() as u16)));
        Table::new(rows, widths).header(header).column_spacing(1).render(area, buf);
    }

    fn help_box(&self, area: Rect, buf: &mut Buffer) {
        let lines = App::help_lines();
        let height = (lines.len() as u16 + 2).min(area.height);
        let width = (lines.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u16 + 4).min(area.width);
        let popup = Rect {
            x: area.x + (area.width - width) / 2,
            y: area.y + (area.height - height) / 2,
            width,
            height,
        };
        Clear.render(popup, buf);
        Paragraph::new(lines.into_iter().map(Line::from).collect::<Vec<_>>())
            .block(Block::new().borders(Borders::ALL).title(" keys "))
            .render(popup, buf);
    }
}

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let [title, body, status] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(0), Constraint::Length(1)]).areas(area);
        self.title().render(title, buf);
        self.table(body, buf);
        self.status(status.width).render(status, buf);
        if self.help {
            self.help_box(body, buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hvstats::snapshot::ObjectReading;
    use hvstats_abi::catalog::vp;
    use hvstats_abi::histogram::Log2Histogram;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::*;
    use crate::top::app::Action;
    use hvstats_testkit::synthetic_instance;

    fn screen(app: &App, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| f.render_widget(app, f.area())).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| (0..width).map(|x| buffer[(x, y)].symbol()).collect::<String>().trim_end().to_owned())
            .collect()
    }

    #[test]
    fn rows_show_rates_per_vp_under_the_partition_total_sorted_by_a_column() {
        let mut before = hvstats_present::live::Reading::of(vec![synthetic_instance(1, 2)]);
        let io = vp::IO_TIME_HISTOGRAM.counter().unwrap();
        let hcall = vp::HYPERCALLS_TIME_HISTOGRAM.counter().unwrap();
        for v in &mut before.instances[0].partitions[0].vps {
            v.histograms = vec![(hcall, Log2Histogram::default()), (io, Log2Histogram::default())];
        }
        let mut after = before.clone();
        after.at = before.at + Duration::from_secs(2);
        for (index, add) in [(0, 20), (1, 100)] {
            let v = &mut after.instances[0].partitions[0].vps[index];
            let ObjectReading::Counters(values) = &mut v.reading else { unreachable!() };
            values.iter_mut().filter(|(c, _)| c.id == vp::HYPERCALLS).for_each(|(_, v)| *v += add);
            // VP 1 waited 0.5 s of the 2 s for a CPU (25 %), VP 0 not at all.
            let waited = if index == 1 { 500_000_000 } else { 0 };
            values
                .iter_mut()
                .filter(|(c, _)| c.id == vp::CPU_WAIT_TIME_PER_DISPATCH)
                .for_each(|(_, v)| *v += waited);
            // VP 1: 100 hypercalls of 300 ns (30 µs in all) and 10 port accesses of 5 µs (50 µs in
            // all): IO dominates by time. VP 0: 20 hypercalls of 70 ns.
            let hist = |ns, n| {
                let mut h = Log2Histogram::default();
                (0..n).for_each(|_| h.record(ns));
                h
            };
            v.histograms[0].1 = hist(if index == 1 { 300 } else { 70 }, add);
            if index == 1 {
                v.histograms[1].1 = hist(5_000, 10);
            }
        }
        let mut app = App::new("/run/hvstats".into(), Duration::from_secs(2));
        app.sample(before);
        app.sample(after);
        let lines = screen(&app, 80, 8);
        assert!(lines[0].starts_with("hvstats top — over 2.0 s"), "{lines:#?}");
        assert!(lines[1].starts_with("VM / VP") && lines[1].contains("Hcall/s"), "{lines:#?}");
        let cells = |line: &str| -> Vec<String> {
            line.get(LABEL_WIDTH..).unwrap_or_default().split_whitespace().map(str::to_owned).collect()
        };
        // The columns that move first (the run time and exits stay at 0 here, and give way).
        assert_eq!(cells(&lines[1]), ["Wait%", "Class", "p50", "p99", "Hcall/s", "Run%"]);
        // CPU wait as a share of the interval: VP 0 none, VP 1 25 %, the partition their sum.
        assert_eq!(
            [&cells(&lines[2])[0], &cells(&lines[3])[0], &cells(&lines[4])[0]],
            ["25.0", "0.0", "25.0"]
        );
        // Partition total 60/s, then VP 0 (10/s) and VP 1 (50/s) by name; each with the p50 and
        // p99 of its dominant class (bucket upper bounds: 70 ns → 127 ns, 300 ns → 511 ns, 5 µs
        // → 8191 ns). The total sums the VPs: IO (50 µs) over hypercalls (31.4 µs).
        assert!(lines[2].starts_with("4242-1-0:1"), "{lines:#?}");
        assert_eq!(cells(&lines[2])[1..5], ["IO", "8.2µs", "8.2µs", "60.0"]);
        assert!(lines[3].starts_with("  VP 0"), "{lines:#?}");
        assert_eq!(cells(&lines[3])[1..5], ["Hypercall", "127ns", "127ns", "10.0"]);
        assert!(lines[4].starts_with("  VP 1"), "{lines:#?}");
        assert_eq!(cells(&lines[4])[1..5], ["IO", "8.2µs", "8.2µs", "50.0"]);
        // By CPU wait (after run time and exits): VP 1 (25 %) before VP 0.
        app.update(Action::SortNext);
        app.update(Action::SortNext);
        app.update(Action::SortNext);
        let lines = screen(&app, 80, 8);
        assert!(lines[0].contains("sort Wait%↓"), "{lines:#?}");
        assert!(lines[3].starts_with("  VP 1"), "{lines:#?}");
        // By p50, ascending: VP 0 (127 ns) before VP 1 (8.2 µs).
        app.update(Action::SortNext);
        app.update(Action::SortReverse);
        let lines = screen(&app, 80, 8);
        assert!(lines[0].contains("sort p50↑"), "{lines:#?}");
        assert!(lines[3].starts_with("  VP 0"), "{lines:#?}");
        assert!(lines[7].starts_with("o/O sort"), "{lines:#?}");
        // 60 columns hold the label and the first few columns only.
        assert_eq!(columns_that_fit(&table::shown().collect::<Vec<_>>(), 60), 3);
        let lines = screen(&app, 60, 8);
        assert!(lines[1].ends_with("p50") && !lines[1].contains("Hcall"), "{lines:#?}");
    }

    #[test]
    fn a_reset_shows_values_since_the_reading_at_the_reset() {
        let first = hvstats_present::live::Reading::of(vec![synthetic_instance(1, 1)]);
        let later = |s| {
            let mut r = first.clone();
            r.at = first.at + Duration::from_secs(s);
            r
        };
        let mut app = App::new("/run/hvstats".into(), Duration::from_secs(1));
        app.sample(first.clone());
        assert!(screen(&app, 80, 5)[0].starts_with("hvstats top — first reading…"));
        app.sample(later(1));
        app.update(Action::Reset);
        app.sample(later(2));
        app.sample(later(4));
        let lines = screen(&app, 80, 5);
        assert!(lines[0].starts_with("hvstats top — since reset 3.0 s"), "{lines:#?}");
        assert!(lines[2].starts_with("4242-1-0:1"), "{lines:#?}");
    }

    #[test]
    fn an_empty_runtime_directory_says_so() {
        let mut app = App::new("/run/hvstats".into(), Duration::from_secs(1));
        let mut empty = hvstats_present::live::Reading::of(vec![synthetic_instance(0, 0)]);
        empty.instances.clear();
        app.sample(empty);
        let lines = screen(&app, 80, 5);
        assert!(
            lines[1].starts_with("no observer or partition publishes under /run/hvstats: start"),
            "{lines:#?}"
        );
    }
}
