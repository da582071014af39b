//! `hvstats plot`: charts of a recording — for each chosen VP counter, its value per VP between
//! consecutive samples (rates per second, % of the time, average cost in µs, as the catalog
//! presents it), over time, with axes, units and a legend. PNG or SVG by the file's extension.
//!
//! The font is bundled (DejaVu Sans Mono, under its licence beside it), so charts look the same on
//! every host and no system font is needed.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Once;

use anyhow::Context;
use hvstats::present;
use hvstats_abi::{Counter, Presentation};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::cmd::recording::{Header, Sample, SampleReader};
use crate::output_file::OutputFile;

/// The bundled font.
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSansMono.ttf");

/// Lines drawn per chart at most (the busiest VPs).
pub const MAX_SERIES: usize = 12;

/// Flags of `hvstats plot`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A recording made by `hvstats record`.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The chart to write: `.png` or `.svg`.
    #[arg(short = 'o', long, value_name = "CHART")]
    output: PathBuf,
    /// A VP counter to chart, by catalog name (repeat for several; default: the three busiest
    /// rates).
    #[arg(long = "counter", value_name = "NAME")]
    counters: Vec<String>,
    /// Chart size in pixels, WIDTHxHEIGHT of each counter's chart (all the charts together at most
    /// 64 MiB of bitmap).
    #[arg(long, value_name = "WxH", default_value = "1000x360", value_parser = parse_size)]
    size: (u32, u32),
    /// Replace CHART if it is an existing regular file (by writing a new file and renaming it).
    #[arg(long)]
    force: bool,
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let parsed = s.split_once('x').and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)));
    match parsed {
        Some((w, h)) if (200..=8000).contains(&w) && (150..=8000).contains(&h) => Ok((w, h)),
        _ => Err(format!("{s:?}: WIDTHxHEIGHT, 200 to 8000 by 150 to 8000 pixels")),
    }
}

/// One chart: a counter and a line per VP.
#[derive(Clone, Debug)]
pub struct Chart {
    /// The counter.
    pub counter: &'static Counter,
    /// The y axis text.
    pub unit: &'static str,
    /// `(vm VP n, points (t, value))`, busiest first.
    pub series: Vec<Series>,
    /// VPs not drawn (beyond [`MAX_SERIES`]).
    pub left_out: usize,
}

impl Chart {
    /// True when every point drawn is 0: nothing moved.
    pub fn is_flat(&self) -> bool {
        self.series.iter().flat_map(|(_, p)| p).all(|&(_, v)| v == 0.0)
    }
}

fn unit_of(c: &Counter) -> &'static str {
    match c.presentation {
        Presentation::Rate => "per second",
        Presentation::PercentTime => "% of the time",
        Presentation::Cost => "µs per event",
        Presentation::CumulativeTime => "ns per second",
        Presentation::Instant => "value",
        Presentation::Histogram => "µs, p99 of each interval (bucket upper bound)",
    }
}

/// One line of a chart: its label (`vm VP n`) and points `(t, value)`.
type Series = (String, Vec<(f64, f64)>);

/// Where a charted counter's values are in a recording's samples: found once per chart, not per
/// sample.
#[derive(Clone, Copy)]
enum Slots {
    /// A histogram, at this index of the header's histograms.
    Histogram(usize),
    /// A value at this index of the header's VP counters, with its paired count's (a cost).
    Value { index: usize, paired: Option<usize> },
    /// Not in the recording (or its paired count is not): nothing to chart.
    Missing,
}

impl Slots {
    fn of(header: &Header, counter: &'static Counter) -> Self {
        let counters = header.vp_counters();
        let index = |name: &str| counters.iter().position(|(c, _)| c.name == name);
        if counter.presentation == Presentation::Histogram {
            return header
                .catalog
                .vp_histograms
                .iter()
                .position(|h| h.name == counter.name)
                .map_or(Slots::Missing, Slots::Histogram);
        }
        match (index(counter.name), counter.paired_count().map(|p| index(p.name))) {
            (Some(index), None) => Slots::Value { index, paired: None },
            (Some(index), Some(Some(paired))) => Slots::Value { index, paired: Some(paired) },
            _ => Slots::Missing,
        }
    }
}

/// Calls `f(label, t, value)` with each VP's value of `counter` (at `slots`) over the interval
/// from sample `a` to sample `b` (at `b`'s time): presented as the catalog says (a cost in µs), or
/// for a histogram the p99 of what the interval recorded, in µs. A VP without a value for the
/// interval is skipped.
fn each_value(
    counter: &'static Counter,
    slots: Slots,
    a: &Sample,
    b: &Sample,
    mut f: impl FnMut(String, f64, f64),
) {
    if matches!(slots, Slots::Missing) {
        return;
    }
    for p in &b.partitions {
        let Some(before) = a.partitions.iter().find(|q| q.vm == p.vm) else { continue };
        for vp in &p.vps {
            let Some(then) = before.vps.iter().find(|v| v.vp == vp.vp) else { continue };
            let value = match slots {
                Slots::Histogram(h) => {
                    let delta = then.histogram(h).zip(vp.histogram(h)).and_then(|(x, y)| y.since(&x));
                    match delta.and_then(|d| d.quantile_upper_ns(0.99)) {
                        Some(ns) => ns as f64 / 1000.0,
                        None => continue,
                    }
                }
                Slots::Value { index, paired } => {
                    let (Some(then), Some(now)) = (then.values.as_ref(), vp.values.as_ref()) else {
                        continue;
                    };
                    let paired = match paired {
                        Some(j) => match (then[j], now[j]) {
                            (Some(x), Some(y)) => Some((x, y)),
                            _ => continue,
                        },
                        None => None,
                    };
                    let (Some(before), Some(after)) = (then[index], now[index]) else { continue };
                    let Some(shown) = present::over_interval(counter, before, after, b.t - a.t, paired)
                    else {
                        continue;
                    };
                    if counter.presentation == Presentation::Cost {
                        shown.value / 1000.0
                    } else {
                        shown.value
                    }
                }
                Slots::Missing => return,
            };
            f(format!("{} VP {}", p.vm, vp.vp), b.t, value);
        }
    }
}

/// The charts of `counters`, from samples that `pairs` hands, each with the one before it, to
/// the function it is given; it is called twice: once to find each chart's busiest VPs (the
/// largest sum of values), once to collect their points. So a recording of any length is charted
/// in the memory of two samples, the sums per VP and the points of the lines drawn.
fn charts_of(
    header: &Header,
    counters: &[&'static Counter],
    mut pairs: impl FnMut(&mut dyn FnMut(&Sample, &Sample)) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Chart>> {
    let slots: Vec<Slots> = counters.iter().map(|c| Slots::of(header, c)).collect();
    let mut sums: Vec<HashMap<String, f64>> = vec![HashMap::new(); counters.len()];
    pairs(&mut |a, b| {
        for ((counter, slots), sums) in counters.iter().zip(&slots).zip(&mut sums) {
            each_value(counter, *slots, a, b, |label, _, value| *sums.entry(label).or_default() += value);
        }
    })?;
    let drawn: Vec<Vec<String>> = sums
        .iter()
        .map(|sums| {
            let mut by_sum: Vec<(&String, f64)> = sums.iter().map(|(l, s)| (l, *s)).collect();
            by_sum.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            by_sum.into_iter().take(MAX_SERIES).map(|(l, _)| l.clone()).collect()
        })
        .collect();
    let mut series: Vec<Vec<Series>> =
        drawn.iter().map(|labels| labels.iter().map(|l| (l.clone(), Vec::new())).collect()).collect();
    pairs(&mut |a, b| {
        for ((counter, slots), lines) in counters.iter().zip(&slots).zip(&mut series) {
            each_value(counter, *slots, a, b, |label, t, value| {
                if let Some((_, points)) = lines.iter_mut().find(|(l, _)| *l == label) {
                    points.push((t, value));
                }
            });
        }
    })?;
    Ok(counters
        .iter()
        .zip(series)
        .zip(&sums)
        .map(|((&counter, series), sums)| Chart {
            counter,
            unit: unit_of(counter),
            left_out: sums.len().saturating_sub(series.len()),
            series,
        })
        .collect())
}

/// Streams the samples of the recording at `path`, each with the one before it, to `f`.
fn stream_pairs(path: &Path, f: &mut dyn FnMut(&Sample, &Sample)) -> anyhow::Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader =
        SampleReader::new(BufReader::new(file)).with_context(|| format!("reading {}", path.display()))?;
    let mut previous = None;
    while let Some(sample) = reader.next().with_context(|| format!("reading {}", path.display()))? {
        if let Some(before) = &previous {
            f(before, &sample);
        }
        previous = Some(sample);
    }
    Ok(())
}

/// The counters charted by default: the maintained VP rates that moved most between the `first`
/// and `last` samples.
pub fn busiest(header: &Header, first: &Sample, last: &Sample, n: usize) -> Vec<&'static Counter> {
    let total = |s: &Sample, i: usize| -> u64 {
        s.partitions.iter().flat_map(|p| &p.vps).filter_map(|v| *v.values.as_ref()?.get(i)?).sum()
    };
    let mut moved: Vec<(&'static Counter, u64)> = header
        .vp_counters()
        .into_iter()
        .enumerate()
        .filter_map(|(i, (info, counter))| {
            let counter = counter.filter(|c| info.maintained && c.presentation == Presentation::Rate)?;
            Some((counter, total(last, i).saturating_sub(total(first, i))))
        })
        .filter(|(_, moved)| *moved > 0)
        .collect();
    moved.sort_by_key(|m| std::cmp::Reverse(m.1));
    moved.into_iter().take(n).map(|(c, _)| c).collect()
}

fn register_font() -> anyhow::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
            .map_err(|_| anyhow::anyhow!("the bundled font cannot be read"));
    });
    result
}

/// Draws `charts` one under the other on `root`.
///
/// # Errors
/// When the backend fails to draw.
pub fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, charts: &[Chart]) -> anyhow::Result<()> {
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing failed: {e}");
    root.fill(&WHITE).map_err(fail)?;
    for (area, c) in root.split_evenly((charts.len().max(1), 1)).iter().zip(charts) {
        let x_max = c.series.iter().flat_map(|(_, p)| p.iter().map(|(t, _)| *t)).fold(1.0f64, f64::max);
        let y_max = c.series.iter().flat_map(|(_, p)| p.iter().map(|(_, v)| *v)).fold(0.0f64, f64::max);
        let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
        let mut title = c.counter.name.to_owned();
        if c.left_out > 0 {
            title += &format!(" (busiest {MAX_SERIES} VPs; {} more not drawn)", c.left_out);
        }
        if c.series.is_empty() {
            title += " (nothing to show)";
        } else if c.is_flat() {
            title += " (no activity)";
        }
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(fail)?;
        chart
            .configure_mesh()
            .x_desc("time since the start of the recording (s)")
            .y_desc(c.unit)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(fail)?;
        for (i, (label, points)) in c.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(fail)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        if !c.series.is_empty() {
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(fail)?;
        }
    }
    root.present().map_err(fail)?;
    Ok(())
}

/// The largest image `plot` draws, in bytes of its bitmap (3 per pixel): every chart together.
pub const MAX_BITMAP_BYTES: u64 = 64 << 20;

/// The chart format, from the output's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A PNG image.
    Png,
    /// An SVG document.
    Svg,
}

impl Format {
    /// The format `path`'s extension names.
    ///
    /// # Errors
    /// Any other extension.
    pub fn of(path: &Path) -> anyhow::Result<Self> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("png") => Ok(Format::Png),
            Some("svg") => Ok(Format::Svg),
            _ => anyhow::bail!("{}: the chart is written as .png or .svg", path.display()),
        }
    }
}

/// The whole image's size for `charts` charts of `(width, height)` each, when its bitmap stays
/// within [`MAX_BITMAP_BYTES`].
pub fn image_size((width, height): (u32, u32), charts: usize) -> Option<(u32, u32)> {
    let total = u64::from(height).checked_mul(charts.max(1) as u64)?;
    let bytes = u64::from(width).checked_mul(total)?.checked_mul(3)?;
    (bytes <= MAX_BITMAP_BYTES).then_some((width, u32::try_from(total).ok()?))
}

/// The bytes of `charts` in `format`, `size` being the whole image's.
///
/// # Errors
/// A failure to draw or encode.
pub fn render(format: Format, charts: &[Chart], size: (u32, u32)) -> anyhow::Result<Vec<u8>> {
    register_font()?;
    match format {
        Format::Png => {
            let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
            draw(&BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area(), charts)?;
            let mut png = Vec::new();
            image::ImageEncoder::write_image(
                image::codecs::png::PngEncoder::new(&mut png),
                &rgb,
                size.0,
                size.1,
                image::ColorType::Rgb8,
            )
            .context("encoding the PNG")?;
            Ok(png)
        }
        Format::Svg => {
            let mut svg = String::new();
            draw(&SVGBackend::with_string(&mut svg, size).into_drawing_area(), charts)?;
            Ok(svg.into_bytes())
        }
    }
}

/// A usage error of `plot`: said on standard error, exit status 2, nothing written.
fn usage(message: impl std::fmt::Display) -> anyhow::Result<ExitCode> {
    crate::output::note!("{message}");
    Ok(crate::output::ExitStatus::Usage.into())
}

/// The counters charted when none moved: the first `n` maintained VP rates, in catalog order.
pub fn quiet_defaults(header: &Header, n: usize) -> Vec<&'static Counter> {
    header
        .vp_counters()
        .into_iter()
        .filter_map(|(info, c)| c.filter(|c| info.maintained && c.presentation == Presentation::Rate))
        .take(n)
        .collect()
}

/// Runs `hvstats plot`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The command line first: nothing is read or written for a wrong one.
    let format = match Format::of(&args.output) {
        Ok(f) => f,
        Err(e) => return usage(e),
    };
    let mut named = Vec::new();
    for name in &args.counters {
        match hvstats_abi::catalog::counter_by_name(hvstats_abi::ObjectKind::Vp, name) {
            Some(c) => named.push(c),
            None => {
                return usage(format!(
                    "--counter {name:?} is not a VP counter of the catalog (hvstats catalog lists them){}",
                    crate::cmd::catalog::did_you_mean(hvstats_abi::ObjectKind::Vp, name)
                ));
            }
        }
    }
    let charted = if named.is_empty() { 3 } else { named.len() };
    let Some(size) = image_size(args.size, charted) else {
        return usage(format!(
            "--size {}x{} with {charted} charts is larger than {} MiB of bitmap: fewer --counter or a \
             smaller --size",
            args.size.0,
            args.size.1,
            MAX_BITMAP_BYTES >> 20
        ));
    };
    let file = crate::input::open_regular(&args.file)?;
    // The output before the long read: a path that cannot be written fails at once.
    let mut output = OutputFile::create(&args.output, args.force)?;
    let reading = || format!("reading {}", args.file.display());
    let mut reader = SampleReader::new(BufReader::new(file)).with_context(reading)?;
    let header = reader.header().clone();
    let counters: Vec<&'static Counter> = if named.is_empty() {
        // The first and last samples decide which counters moved most.
        let mut first = None;
        let mut last = None;
        while let Some(sample) = reader.next().with_context(reading)? {
            match first {
                None => first = Some(sample),
                Some(_) => last = Some(sample),
            }
        }
        let busiest = match (&first, last.as_ref().or(first.as_ref())) {
            (Some(first), Some(last)) => busiest(&header, first, last, 3),
            _ => Vec::new(),
        };
        // A quiet recording is charted flat, not refused.
        if busiest.is_empty() { quiet_defaults(&header, 3) } else { busiest }
    } else {
        named
    };
    let charts = charts_of(&header, &counters, |f| stream_pairs(&args.file, f))?;
    let size = (size.0, args.size.1 * counters.len().max(1) as u32);
    let bytes = render(format, &charts, size)?;
    let shown = args.output.display();
    output.file().write_all(&bytes).with_context(|| format!("writing {shown}"))?;
    output.put_in_place()?;
    let _ = writeln!(std::io::stderr(), "hvstats: wrote {shown}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use hvstats_abi::catalog::vp;
    use hvstats_abi::histogram::Log2Histogram;

    use super::*;
    use crate::cmd::recording::{Header, Sample};
    use crate::cmd::serve::bench::synthetic_reading;

    #[test]
    fn a_histogram_is_charted_as_the_p99_of_each_interval() {
        let io = vp::IO_TIME_HISTOGRAM.counter().unwrap();
        // Cumulative IO handling times at t = 0, 1, 2, 3: the intervals record 100 × 700 ns, then
        // nothing, then 97 × 700 ns and 3 × 3 ms.
        let mut h = Log2Histogram::default();
        let mut samples = Vec::new();
        for (t, fast, slow) in [(0.0, 0, 0), (1.0, 100, 0), (2.0, 0, 0), (3.0, 97, 3)] {
            std::iter::repeat_n(700, fast)
                .chain(std::iter::repeat_n(3_000_000, slow))
                .for_each(|ns| h.record(ns));
            let mut reading = synthetic_reading(1, 1);
            reading.instances[0].partitions[0].vps[0].histograms = vec![(io, h)];
            samples.push(Sample::of(&reading, t));
        }
        let pairs = |f: &mut dyn FnMut(&Sample, &Sample)| {
            samples.windows(2).for_each(|w| f(&w[0], &w[1]));
            Ok(())
        };
        let chart = charts_of(&Header::new(1.0, 0), &[io], pairs).unwrap().remove(0);
        assert_eq!(chart.unit, "µs, p99 of each interval (bucket upper bound)");
        assert_eq!(chart.series.len(), 1);
        let (label, points) = &chart.series[0];
        assert_eq!(label, "4242-1-0:1 VP 0");
        // [512, 1024) ns, then no point for the empty interval, then [2^21, 2^22) ns.
        assert_eq!(points, &[(1.0, 1.023), (3.0, 4194.303)]);
    }
}
