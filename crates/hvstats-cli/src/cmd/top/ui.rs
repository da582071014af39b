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
