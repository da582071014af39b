//! Drawing the live view: a title line, the table (as many columns as the width allows), and a
//! status line with the keys, a prompt or a message; the help over it on request. Drawing only
//! reads the [`App`].

use hvstats::present::VP_COLUMNS;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Widget};

use super::app::{App, Prompt};
use super::table::{self, LABEL_WIDTH, column_width};

/// How many columns fit in `width` cells, at least one.
pub fn columns_that_fit(width: u16) -> usize {
    let mut used = LABEL_WIDTH;
    let mut n = 0;
    for c in &VP_COLUMNS {
        used += 1 + column_width(c);
        if used > width as usize {
            break;
        }
        n += 1;
    }
    n.max(1)
}

impl App {
    fn title(&self) -> Line<'_> {
        let window = match (self.seconds(), self.since_reset) {
            (Some(s), true) => format!("since reset {s:.1} s"),
            (Some(s), false) => format!("over {s:.1} s"),
            (None, _) => "first reading…".into(),
        };
        let sort = match self.sort {
            Some(c) => format!("sort {}{}", VP_COLUMNS[c].header(), if self.descending { "↓" } else { "↑" }),
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

    fn status(&self) -> Line<'_> {
        match (&self.prompt, &self.message) {
            (Some(Prompt::Filter(t)), _) => {
                Line::from(format!("filter regex: {t}▏ (Enter: apply, Esc: cancel)"))
            }
            (Some(Prompt::Interval(t)), _) => Line::from(format!("interval in seconds: {t}▏ (Enter, Esc)")),
            (None, Some(m)) => Line::from(m.as_str()).style(Style::new().add_modifier(Modifier::REVERSED)),
            (None, None) => {
                Line::from("o/O sort  i invert  f filter  p pause  s interval  r reset  h help  q quit")
            }
        }
    }

    fn table(&self, area: Rect, buf: &mut Buffer) {
        let groups = self.groups();
        if groups.is_empty() {
            let text = match &self.latest {
                Some(r) if r.instances.is_empty() => format!("no live hvstats instance under {}", self.dir),
                Some(_) if self.filter.is_some() => "no VM matches the filter".to_owned(),
                Some(_) if self.base.is_some() => "no partition in the live instances".to_owned(),
                _ => "reading…".to_owned(),
            };
            Paragraph::new(text).render(area, buf);
            return;
        }
        let shown = columns_that_fit(area.width);
        let header =
            Row::new(std::iter::once("VM / VP".to_owned()).chain(
                VP_COLUMNS[..shown].iter().map(|c| format!("{:>w$}", c.header(), w = column_width(c))),
            ))
            .style(Style::new().add_modifier(Modifier::REVERSED));
        let line = |r: &table::Row, indent: &str| {
            std::iter::once(format!("{indent}{}", r.label))
                .chain(
                    VP_COLUMNS[..shown]
                        .iter()
                        .zip(&r.values)
                        .map(|(c, v)| format!("{:>w$}", table::cell(*v), w = column_width(c))),
                )
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
            .chain(VP_COLUMNS[..shown].iter().map(|c| Constraint::Length(column_width(c) as u16)));
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
        self.status().render(status, buf);
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
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::*;
    use crate::cmd::serve::bench::synthetic_reading;
    use crate::cmd::top::app::Action;

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
        let before = synthetic_reading(1, 2);
        let mut after = before.clone();
        after.at = before.at + Duration::from_secs(2);
        for (index, add) in [(0, 20), (1, 100)] {
            let ObjectReading::Counters(values) = &mut after.instances[0].partitions[0].vps[index].reading
            else {
                unreachable!()
            };
            values.iter_mut().filter(|(c, _)| c.id == vp::HYPERCALLS).for_each(|(_, v)| *v += add);
        }
        let mut app = App::new("/run/hvstats".into(), Duration::from_secs(2));
        app.sample(before);
        app.sample(after);
        let lines = screen(&app, 60, 8);
        assert!(lines[0].starts_with("hvstats top — over 2.0 s"), "{lines:#?}");
        assert!(lines[1].starts_with("VM / VP") && lines[1].contains("Hcall/s"), "{lines:#?}");
        // Partition total 60/s, then VP 0 (10/s) and VP 1 (50/s) by name.
        // The third cell from the right of the label: Run%, then Hcall/s.
        let hcall = |line: &str| line.get(LABEL_WIDTH..)?.split_whitespace().nth(1).map(str::to_owned);
        assert!(lines[2].starts_with("4242-1-0:1"), "{lines:#?}");
        assert_eq!(hcall(&lines[2]).as_deref(), Some("60.0"));
        assert!(lines[3].starts_with("  VP 0") && hcall(&lines[3]).as_deref() == Some("10.0"), "{lines:#?}");
        assert!(lines[4].starts_with("  VP 1") && hcall(&lines[4]).as_deref() == Some("50.0"), "{lines:#?}");
        app.update(Action::SortNext);
        app.update(Action::SortNext);
        let lines = screen(&app, 60, 8);
        assert!(lines[3].starts_with("  VP 1"), "{lines:#?}");
        assert!(lines[7].starts_with("o/O sort"), "{lines:#?}");
        // 60 columns hold the label and the first few columns only.
        assert_eq!(columns_that_fit(60), 4);
        assert!(lines[1].ends_with("IO/s") && !lines[1].contains("CPUID"), "{lines:#?}");
    }

    #[test]
    fn an_empty_runtime_directory_says_so() {
        let mut app = App::new("/run/hvstats".into(), Duration::from_secs(1));
        let mut empty = synthetic_reading(0, 0);
        empty.instances.clear();
        app.sample(empty);
        let lines = screen(&app, 80, 5);
        assert_eq!(lines[1], "no live hvstats instance under /run/hvstats");
    }
}
