//! The curve of the observer's cost against the VMs it observes, drawn from the `observe-scale-*`
//! rows as an SVG (`hvstats-bench --chart FILE`): the CPU per refresh per VM and per vCPU thread
//! (µs, the left axis) at each fleet size measured, each point the row's median. The font is the
//! one `hvstats plot` bundles, so the chart looks the same on every host.

use plotters::prelude::*;

use crate::observe_scale;
use crate::row::Row;

/// The bundled font (DejaVu Sans Mono, under its licence beside it).
const FONT: &[u8] = include_bytes!("../../hvstats-surfaces/assets/fonts/DejaVuSansMono.ttf");

/// The chart's size in pixels.
const SIZE: (u32, u32) = (720, 420);

/// The goal of the `observe-scale-*` rows, per VM: 1 % of a CPU at 1,000 VMs and a 1 s refresh.
const GOAL_US_PER_VM: f64 = 10.0;

/// The points of fact `fact` of the measured `observe-scale-*` rows: (VMs observed, value).
pub fn scale_points(rows: &[Row], fact: &str) -> Vec<(f64, f64)> {
    rows.iter()
        .filter(|row| observe_scale::ROWS.contains(&row.name()))
        .filter_map(|row| match row {
            Row::Measured { facts, .. } => {
                let get = |name: &str| facts.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
                Some((get("vms")?, get(fact)?))
            }
            Row::Skipped { .. } => None,
        })
        .collect()
}

/// The SVG of the `observe-scale-*` rows of `rows`; `None` when none was measured.
///
/// # Errors
/// When the font cannot be read or drawing fails.
pub fn scale_svg(rows: &[Row]) -> Result<Option<String>, String> {
    let per_vm = scale_points(rows, "us_per_vm");
    let per_thread = scale_points(rows, "us_per_vcpu_thread");
    let floor = scale_points(rows, "floor_us_per_vm");
    if per_vm.is_empty() {
        return Ok(None);
    }
    static FONT_ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let registered = FONT_ONCE
        .get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if !registered {
        return Err("the bundled font cannot be read".into());
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let fail = |e: DrawingAreaErrorKind<std::io::Error>| format!("drawing the chart failed: {e}");
        root.fill(&WHITE).map_err(fail)?;
        let x_max = per_vm.iter().map(|p| p.0).fold(64.0, f64::max) * 1.1;
        let y_max = per_vm.iter().chain(&per_thread).map(|p| p.1).fold(GOAL_US_PER_VM, f64::max) * 1.2;
        let goal = [(0.0, GOAL_US_PER_VM), (x_max, GOAL_US_PER_VM)];
        let mut chart = ChartBuilder::on(&root)
            .caption("observe --all: CPU per 1 s refresh", ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(fail)?;
        chart
            .configure_mesh()
            .x_desc("VMs observed (4 vCPU threads each)")
            .y_desc("µs of CPU per refresh")
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(fail)?;
        let lines = [
            ("per VM", &per_vm, RGBColor(31, 119, 180)),
            ("per vCPU thread", &per_thread, RGBColor(214, 39, 40)),
            ("per VM, the kernel's reads alone", &floor, RGBColor(44, 160, 44)),
        ];
        let goal_style = RGBColor(127, 127, 127).stroke_width(1);
        chart
            .draw_series(LineSeries::new(goal, goal_style))
            .map_err(fail)?
            .label("goal per VM")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], goal_style));
        for (label, points, colour) in lines.into_iter().filter(|(_, points, _)| !points.is_empty()) {
            let style = colour.stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), style))
                .map_err(fail)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled()))).map_err(fail)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(fail)?;
        root.present().map_err(fail)?;
    }
    Ok(Some(svg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Rounds;

    fn scale_row(name: &'static str, vms: f64, us_per_vm: f64) -> Row {
        let rounds = Rounds { ours: vec![us_per_vm * vms / 1e6; 2], baseline: vec![1.0; 2] };
        let facts = vec![("vms", vms), ("us_per_vm", us_per_vm), ("us_per_vcpu_thread", us_per_vm / 4.0)];
        Row::Measured { name, rounds, unit: "s/refresh", goal: Some(0.01), facts }
    }

    #[test]
    fn the_chart_draws_each_scale_row_by_the_vms_it_observed_and_nothing_without_one() {
        let rows = [
            scale_row("observe-scale-64", 64.0, 400.0),
            scale_row("observe-scale-256", 256.0, 420.0),
            Row::Skipped { name: "observe-scale-1024", why: "no memory".into() },
            Row::Skipped { name: "read-vp-vs-stats-fd", why: "no KVM".into() },
        ];
        assert_eq!(scale_points(&rows, "us_per_vm"), [(64.0, 400.0), (256.0, 420.0)]);
        assert_eq!(scale_points(&rows, "us_per_vcpu_thread"), [(64.0, 100.0), (256.0, 105.0)]);
        let svg = scale_svg(&rows).unwrap().unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("per VM") && svg.contains("VMs observed"), "{svg}");
        assert!(svg.contains("goal per VM") && !svg.contains("reads alone"), "{svg}");
        assert_eq!(scale_svg(&rows[2..]).unwrap(), None);
    }

    #[test]
    fn the_chart_draws_the_floor_where_the_rows_measured_it() {
        let mut rows =
            [scale_row("observe-scale-64", 64.0, 30.0), scale_row("observe-scale-256", 256.0, 25.0)];
        for (row, floor) in rows.iter_mut().zip([11.0, 9.0]) {
            if let Row::Measured { facts, .. } = row {
                facts.push(("floor_us_per_vm", floor));
            }
        }
        assert_eq!(scale_points(&rows, "floor_us_per_vm"), [(64.0, 11.0), (256.0, 9.0)]);
        let svg = scale_svg(&rows).unwrap().unwrap();
        assert!(
            svg.contains("the kernel&apos;s reads alone") || svg.contains("the kernel's reads alone"),
            "{svg}"
        );
    }
}
