//! The charts of `hvstats plot`: for each chosen VP counter, from a recording,, its value per VP between
//! consecutive samples (rates per second, % of the time, average cost in µs, as the catalog
//! presents it), over time, with axes, units and a legend. PNG or SVG by the file's extension.
//!
//! The font is bundled (DejaVu Sans Mono, under its licence beside it), so charts look the same on
//! every host and no system font is needed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Once;

use hvstats_abi::{Counter, Presentation};
use hvstats_present::present::{self, Interval};
use plotters::coord::Shift;
use plotters::prelude::*;

use hvstats_abi::histogram::Log2Histogram;
use hvstats_present::text::Escaped;

use crate::recording::{Header, RecordingError, SampleReader, VpAt, VpKey, VpSample};

/// The bundled font.
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSansMono.ttf");

/// Lines drawn per chart at most (the busiest VPs).
const MAX_SERIES: usize = 12;

/// Why a chart could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The output's extension names no format this module writes.
    #[error("{}: the chart is written as .png or .svg", .0.display())]
    Extension(PathBuf),
    /// The bundled font did not load.
    #[error("the bundled font cannot be read")]
    Font,
    /// The drawing backend failed.
    #[error("drawing failed: {0}")]
    Draw(String),
    /// The PNG encoder failed.
    #[error("encoding the PNG")]
    Encode(#[source] image::ImageError),
}

/// One chart: a counter and a line per VP.
#[derive(Clone, Debug)]
pub struct Chart {
    /// The catalog row charted; its name titles the chart.
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
    match present::shown_as(c) {
        Presentation::Rate => "per second",
        Presentation::PercentTime => "% of the time",
        Presentation::Cost => "µs per event",
        Presentation::CumulativeTime => "ns per second",
        Presentation::Instant => "value",
        Presentation::State => "state code",
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

/// What a chart needs of a VP's previous sample to give its value over the next interval.
#[derive(Clone)]
enum Previous {
    /// The counter's value and its paired count's.
    Value(Option<u64>, Option<u64>),
    /// The VP's histogram at the previous sample (`None` when that sample lacked it).
    Histogram(Option<Box<Log2Histogram>>),
    /// Nothing (the counter is not in the recording).
    Nothing,
}

impl Previous {
    fn of(slots: Slots, vp: &VpSample) -> Self {
        match slots {
            Slots::Histogram(h) => Previous::Histogram(vp.histogram(h).map(Box::new)),
            Slots::Value { index, paired } => {
                let at = |i: usize| vp.values.as_ref().and_then(|v| v.get(i).copied().flatten());
                Previous::Value(at(index), paired.and_then(at))
            }
            Slots::Missing => Previous::Nothing,
        }
    }
}

/// A VP's value of `counter` (at `slots`) over `interval`, from `then` to `now`: presented as
/// the catalog says (a cost in µs), or for a histogram the p99 of what the interval recorded, in
/// µs. `None` when the interval has no value (two samples of the same publication among them: no
/// point, rather than a dip to 0).
fn interval_value(
    counter: &'static Counter,
    slots: Slots,
    then: &Previous,
    now: &VpSample,
    interval: &Interval,
) -> Option<f64> {
    match (slots, then) {
        (Slots::Histogram(h), Previous::Histogram(then)) => {
            let delta = vp_histogram_since(then.as_deref()?, now, h)?;
            Some(delta.quantile_upper_ns(0.99)? as f64 / 1000.0)
        }
        (Slots::Value { paired: paired_slot, .. }, Previous::Value(before, before_paired)) => {
            let Previous::Value(after, after_paired) = Previous::of(slots, now) else { return None };
            let paired = match paired_slot {
                Some(_) => Some((before_paired.as_ref().copied()?, after_paired?)),
                None => None,
            };
            let shown = present::between(counter, (*before)?, after?, interval, paired)?;
            Some(if present::shown_as(counter) == Presentation::Cost {
                shown.value / 1000.0
            } else {
                shown.value
            })
        }
        _ => None,
    }
}

fn vp_histogram_since(then: &Log2Histogram, now: &VpSample, h: usize) -> Option<Log2Histogram> {
    now.histogram(h)?.since(then)
}

/// A VP as plot follows it through one pass over the recording.
struct Track {
    /// Its number, in order of first appearance (the same in every pass).
    id: usize,
    /// The sample it was last seen in.
    seen: usize,
    /// Per chart, what its value over the next interval needs.
    previous: Vec<Previous>,
    /// Its publication time in the sample it was last seen in (`None`: not recorded).
    published: Option<u64>,
}

/// What a pass calls for each VP of each sample: `f(sample number, VP)`.
pub type VisitVp<'a> = dyn FnMut(usize, VpAt<'_>) + 'a;

/// One pass over a recording: calls its argument for each VP of each sample, in order.
type Pass<'a, E> = dyn FnMut(&mut VisitVp<'_>) -> Result<(), E> + 'a;

/// Follows every VP through one pass, calling `value(chart, vp id, t, value)` for each chart's
/// value of each VP over each interval between two consecutive samples it appears in; `first(vp
/// id, at)` is called when a VP first appears.
fn follow<E>(
    counters: &[&'static Counter],
    slots: &[Slots],
    published_at: Option<usize>,
    pass: &mut Pass<'_, E>,
    mut first: impl FnMut(usize, &VpAt<'_>),
    mut value: impl FnMut(usize, usize, f64, f64),
) -> Result<(), E> {
    let mut tracks: HashMap<VpKey, Track> = HashMap::new();
    let mut times: Vec<f64> = Vec::new();
    pass(&mut |n, at| {
        if times.len() <= n {
            times.resize(n + 1, at.t);
        }
        let key = at.key();
        let fresh = tracks.len();
        let track = tracks.entry(key).or_insert_with(|| {
            first(fresh, &at);
            Track {
                id: fresh,
                seen: usize::MAX,
                previous: vec![Previous::Nothing; slots.len()],
                published: None,
            }
        });
        let consecutive = n > 0 && track.seen == n - 1;
        let published = published_at.and_then(|i| at.vp.values.as_ref()?.get(i).copied().flatten());
        let interval = Interval::dated(
            (track.published, published),
            (None, None),
            at.t - times[n.saturating_sub(1)],
            at.vp.run_loop_live,
        );
        for (chart, (&counter, &slot)) in counters.iter().zip(slots).enumerate() {
            if consecutive
                && let Some(v) = interval_value(counter, slot, &track.previous[chart], &at.vp, &interval)
            {
                value(chart, track.id, at.t, v);
            }
            track.previous[chart] = Previous::of(slot, &at.vp);
        }
        track.published = published;
        track.seen = n;
    })
}

/// The VPs' labels, those of two VMs that share a name told apart by their instance and partition.
fn told_apart(labels: &[(String, VpKey)]) -> Vec<String> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (label, _) in labels {
        *count.entry(label).or_default() += 1;
    }
    labels
        .iter()
        .map(|(label, key)| match count.get(label.as_str()) {
            Some(&n) if n > 1 => format!("{label} [{}:{}]", Escaped(&key.instance), key.partition),
            _ => label.clone(),
        })
        .collect()
}

/// The VPs a chart draws: at most [`MAX_SERIES`], the largest `sums` first (by label on a tie).
fn busiest_vps(sums: &[Option<f64>], shown: &[String]) -> Vec<usize> {
    let mut by_sum: Vec<(usize, f64)> =
        sums.iter().enumerate().filter_map(|(id, s)| Some((id, (*s)?))).collect();
    by_sum.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| shown[a.0].cmp(&shown[b.0])));
    by_sum.into_iter().take(MAX_SERIES).map(|(id, _)| id).collect()
}

/// The charts of `counters`, from two passes over the recording (each one VP at a time): one to
/// find each chart's busiest VPs (the largest sum of values), one to collect their points. So a
/// recording of any length and width is charted in the memory of one line, a few numbers per VP
/// and the points of the lines drawn.
///
/// # Errors
/// Whatever a pass returns.
pub fn charts_of<E>(
    header: &Header,
    counters: &[&'static Counter],
    mut pass: impl FnMut(&mut VisitVp<'_>) -> Result<(), E>,
) -> Result<Vec<Chart>, E> {
    let slots: Vec<Slots> = counters.iter().map(|c| Slots::of(header, c)).collect();
    // Per VP: its label and its identity; per chart and VP: the sum of its values (None: no value).
    let mut labels: Vec<(String, VpKey)> = Vec::new();
    let mut sums: Vec<Vec<Option<f64>>> = vec![Vec::new(); counters.len()];
    follow(
        counters,
        &slots,
        header.vp_published_at(),
        &mut pass,
        |id, at| {
            debug_assert_eq!(id, labels.len());
            labels.push((format!("{} VP {}", Escaped(at.vm), at.vp.vp), at.key()));
        },
        |chart, id, _, v| {
            let sums = &mut sums[chart];
            if sums.len() <= id {
                sums.resize(id + 1, None);
            }
            *sums[id].get_or_insert(0.0) += v;
        },
    )?;
    let shown = told_apart(&labels);
    let drawn: Vec<Vec<usize>> = sums.iter().map(|sums| busiest_vps(sums, &shown)).collect();
    let mut points: Vec<HashMap<usize, Vec<(f64, f64)>>> =
        drawn.iter().map(|ids| ids.iter().map(|&id| (id, Vec::new())).collect()).collect();
    follow(
        counters,
        &slots,
        header.vp_published_at(),
        &mut pass,
        |_, _| {},
        |chart, id, t, v| {
            if let Some(line) = points[chart].get_mut(&id) {
                line.push((t, v));
            }
        },
    )?;
    Ok(counters
        .iter()
        .zip(drawn)
        .zip(points)
        .zip(&sums)
        .map(|(((&counter, ids), mut points), sums)| Chart {
            counter,
            unit: unit_of(counter),
            left_out: sums.iter().flatten().count().saturating_sub(ids.len()),
            series: ids
                .iter()
                .map(|&id| (shown[id].clone(), points.remove(&id).unwrap_or_default()))
                .collect(),
        })
        .collect())
}

/// The counters charted by default: the maintained VP rates that moved most between the first
/// and the last sample (totals over the VPs of each, `first` and `last`).
pub fn busiest(header: &Header, first: &[u64], last: &[u64], n: usize) -> Vec<&'static Counter> {
    let mut moved: Vec<(&'static Counter, u64)> = header
        .vp_counters()
        .into_iter()
        .enumerate()
        .filter_map(|(i, (info, counter))| {
            let counter = counter.filter(|c| info.maintained && c.presentation == Presentation::Rate)?;
            let moved = last.get(i).copied().unwrap_or(0).saturating_sub(first.get(i).copied().unwrap_or(0));
            Some((counter, moved))
        })
        .filter(|(_, moved)| *moved > 0)
        .collect();
    moved.sort_by_key(|m| std::cmp::Reverse(m.1));
    moved.into_iter().take(n).map(|(c, _)| c).collect()
}

/// Each VP counter's total over the VPs of each sample, first and last, read one VP at a time
/// (shorter than the header's counters, or empty, where the rest are zeros).
///
/// # Errors
/// As [`SampleReader::next_with`].
pub fn first_and_last_totals<R: std::io::BufRead>(
    reader: &mut SampleReader<R>,
) -> Result<(Vec<u64>, Vec<u64>), RecordingError> {
    let counters = reader.header().catalog.vp.len();
    let (mut first, mut last): (Option<Vec<u64>>, Vec<u64>) = (None, Vec::new());
    loop {
        // Made at a sample's first VP, whose values pay for it: a sample without VPs costs
        // nothing, however many counters a (hostile) header lists. Empty means all zeros.
        let mut totals = Vec::new();
        let read = reader.next_with(|at| {
            if totals.is_empty() {
                totals = vec![0u64; counters];
            }
            for (total, v) in totals.iter_mut().zip(at.vp.values.iter().flatten()) {
                *total = total.saturating_add(v.unwrap_or(0));
            }
        })?;
        if read.is_none() {
            break;
        }
        if first.is_none() {
            first = Some(totals.clone());
        }
        last = totals;
    }
    Ok((first.unwrap_or_default(), last))
}

fn register_font() -> Result<(), ChartError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
            .map_err(|_| ChartError::Font);
    });
    result
}

/// Draws `charts` one under the other on `root`.
///
/// # Errors
/// When the backend fails to draw.
fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, charts: &[Chart]) -> Result<(), ChartError> {
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| ChartError::Draw(e.to_string());
    root.fill(&WHITE).map_err(fail)?;
    let colours = colours_of(charts);
    for (area, c) in root.split_evenly((charts.len().max(1), 1)).iter().zip(charts) {
        let x_max = c.series.iter().flat_map(|(_, p)| p.iter().map(|(t, _)| *t)).fold(1.0f64, f64::max);
        let y_max = c.series.iter().flat_map(|(_, p)| p.iter().map(|(_, v)| *v)).fold(0.0f64, f64::max);
        let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
        let mut title = hvstats_present::present::shown_name(c.counter).to_owned();
        if c.left_out > 0 {
            title += &format!(" (busiest {MAX_SERIES} VPs; {} more not drawn)", c.left_out);
        }
        if c.series.is_empty() {
            title += " (nothing to show)";
        } else if c.is_flat() {
            title += " (no activity)";
        }
        // The legend has a column of its own, right of the plot: it never covers a line.
        let width = area.dim_in_pixel().0;
        let legend_width = if c.series.is_empty() { 0 } else { (width / 3).min(300) };
        let (plot_area, legend_area) = area.split_horizontally(width.saturating_sub(legend_width));
        let mut chart = ChartBuilder::on(&plot_area)
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
            .x_label_formatter(&|v| si(*v))
            .y_label_formatter(&|v| si(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(fail)?;
        for (i, (label, points)) in c.series.iter().enumerate() {
            let (r, g, b) = LINE_COLOURS[colours.get(label.as_str()).copied().unwrap_or(0)];
            let color = RGBColor(r, g, b).to_rgba();
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(fail)?;
            let y = 40 + 20 * i as i32;
            legend_area
                .draw(&PathElement::new(vec![(4, y), (28, y)], color.stroke_width(3)))
                .map_err(fail)?;
            legend_area.draw(&Text::new(label.as_str(), (34, y - 7), ("sans-serif", 13))).map_err(fail)?;
        }
    }
    root.present().map_err(fail)?;
    Ok(())
}

/// `v` with an SI prefix and at most 3 significant decimals: 1.4M, 250k, 0.5.
fn si(v: f64) -> String {
    let a = v.abs();
    let (scale, prefix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(scale, _)| a >= *scale)
        .unwrap_or((1.0, ""));
    let digits = format!("{:.2}", v / scale);
    let digits = digits.trim_end_matches('0').trim_end_matches('.');
    format!("{digits}{prefix}")
}

/// The colours of lines: distinct, and dark enough to read on white (plotters' `Palette99` less
/// its pale ones).
const LINE_COLOURS: [(u8, u8, u8); 14] = [
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (240, 50, 230),
    (0, 128, 128),
    (170, 110, 40),
    (128, 0, 0),
    (128, 128, 0),
    (0, 0, 128),
    (128, 128, 128),
    (0, 0, 0),
    (70, 190, 190),
];

/// A line's colour (an index into [`LINE_COLOURS`]), from its label: the same VP has the same colour
/// in every chart, unless another line of the chart has it already (`used`), then the next free
/// one.
fn colour_index(label: &str, used: &mut [bool]) -> usize {
    // FNV-1a, then the splitmix64 finaliser so labels that differ in one character spread over
    // the palette: stable across runs and builds, unlike the standard library's hasher.
    let mut h =
        label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    let n = used.len().max(1);
    let first = (h % n as u64) as usize;
    let free = (0..n).map(|k| (first + k) % n).find(|&i| !used.get(i).copied().unwrap_or(true));
    let i = free.unwrap_or(first);
    if let Some(u) = used.get_mut(i) {
        *u = true;
    }
    i
}

/// Each line's colour (an index into [`LINE_COLOURS`]) for every chart of one image, by its label
/// (the VP's identity): chosen once over the labels of all the charts, in the labels' order, so a
/// VP keeps its colour from chart to chart whatever other lines each chart has.
fn colours_of(charts: &[Chart]) -> std::collections::HashMap<&str, usize> {
    let labels: std::collections::BTreeSet<&str> =
        charts.iter().flat_map(|c| c.series.iter().map(|(label, _)| label.as_str())).collect();
    let mut used = [false; LINE_COLOURS.len()];
    labels.into_iter().map(|label| (label, colour_index(label, &mut used))).collect()
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
    pub fn of(path: &Path) -> Result<Self, ChartError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("png") => Ok(Format::Png),
            Some("svg") => Ok(Format::Svg),
            _ => Err(ChartError::Extension(path.to_path_buf())),
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
pub fn render(format: Format, charts: &[Chart], size: (u32, u32)) -> Result<Vec<u8>, ChartError> {
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
            .map_err(ChartError::Encode)?;
            Ok(png)
        }
        Format::Svg => {
            let mut svg = String::new();
            draw(&SVGBackend::with_string(&mut svg, size).into_drawing_area(), charts)?;
            Ok(svg.into_bytes())
        }
    }
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

#[cfg(test)]
mod tests {
    use hvstats::snapshot::ObjectReading;
    use hvstats_abi::catalog::vp;
    use hvstats_abi::histogram::Log2Histogram;

    use super::*;
    use crate::recording::{Header, Sample};
    use hvstats_testkit::synthetic_instance;

    /// A pass over `samples` as `stream_vps` makes one over a file.
    fn pass(samples: &[Sample]) -> impl FnMut(&mut VisitVp<'_>) -> Result<(), RecordingError> + '_ {
        |f| {
            for (n, s) in samples.iter().enumerate() {
                for p in &s.partitions {
                    for vp in &p.vps {
                        let at = VpAt {
                            t: s.t,
                            vm: &p.vm,
                            instance: &p.instance,
                            partition: p.partition,
                            vp: vp.clone(),
                        };
                        f(n, at);
                    }
                }
            }
            Ok(())
        }
    }

    #[test]
    fn ticks_are_si_scaled_and_colours_follow_the_vp() {
        assert_eq!(si(1_400_000.0), "1.4M");
        assert_eq!(si(250_000.0), "250k");
        assert_eq!(si(999.0), "999");
        assert_eq!(si(0.5), "0.5");
        assert_eq!(si(0.0), "0");
        assert_eq!(si(2.5e9), "2.5G");
        // The same VP, the same colour, chart after chart; within a chart, twelve lines, twelve
        // colours.
        let fresh = || [false; LINE_COLOURS.len()];
        assert_eq!(colour_index("web VP 1", &mut fresh()), colour_index("web VP 1", &mut fresh()));
        let mut used = fresh();
        let chart: std::collections::HashSet<usize> =
            (0..12).map(|i| colour_index(&format!("web VP {i}"), &mut used)).collect();
        assert_eq!(chart.len(), 12);
    }

    #[test]
    fn a_vp_keeps_its_colour_in_every_chart_whatever_lines_each_chart_has() {
        let chart = |counter: hvstats_abi::CounterId, vps: &[u32]| Chart {
            counter: counter.counter().unwrap(),
            unit: "per second",
            series: vps.iter().map(|v| (format!("web VP {v}"), vec![(0.0, 1.0)])).collect(),
            left_out: 0,
        };
        // Twelve VPs with IO exits, two of them with hypercalls too, and the same two alone.
        let all: Vec<u32> = (0..12).collect();
        let charts = [
            chart(vp::IO_INSTRUCTIONS, &all),
            chart(vp::HYPERCALLS, &[7, 11]),
            chart(vp::HLT_INSTRUCTIONS, &[11]),
        ];
        let colours = colours_of(&charts);
        // One colour per VP for the whole image: the charts that draw VP 11 draw it alike, and
        // twelve VPs have twelve colours.
        assert_eq!(colours.len(), 12);
        assert_eq!(colours.values().collect::<std::collections::HashSet<_>>().len(), 12);
        // Chosen by the VPs' identities, not by which chart lists them first or in what order.
        let reversed = [chart(vp::HLT_INSTRUCTIONS, &[11]), chart(vp::IO_INSTRUCTIONS, &all)];
        assert_eq!(colours_of(&reversed), colours);
    }

    #[test]
    fn a_sample_of_the_same_publication_is_no_point_and_rates_follow_the_publications() {
        let io = vp::IO_INSTRUCTIONS.counter().unwrap();
        // Sampled every 0.5 s; the publisher refreshed at 0, 1 and 2 s with 54 exits a second.
        // The reader's clock would chart 108, 0, 108, 0; the publications chart 54 twice.
        let mut samples = Vec::new();
        for (t, published_s, count) in
            [(0.2, 0, 100), (0.7, 1, 154), (1.2, 1, 154), (1.7, 2, 208), (2.2, 2, 208)]
        {
            let mut reading = hvstats_present::live::Reading::of(vec![synthetic_instance(1, 1)]);
            let ObjectReading::Counters(values) = &mut reading.instances[0].partitions[0].vps[0].reading
            else {
                unreachable!()
            };
            for (c, v) in values.iter_mut() {
                match c.id {
                    id if id == vp::IO_INSTRUCTIONS => *v = count,
                    id if id == vp::PUBLISHED => *v = 5_000_000_000 + published_s * 1_000_000_000,
                    _ => {}
                }
            }
            samples.push(Sample::of(&reading, t));
        }
        let chart = charts_of(&Header::new(0.5, 0), &[io], pass(&samples)).unwrap().remove(0);
        let (_, points) = &chart.series[0];
        assert_eq!(points, &[(0.7, 54.0), (1.7, 54.0)]);
    }

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
            let mut reading = hvstats_present::live::Reading::of(vec![synthetic_instance(1, 1)]);
            reading.instances[0].partitions[0].vps[0].histograms = vec![(io, h)];
            samples.push(Sample::of(&reading, t));
        }
        let chart = charts_of(&Header::new(1.0, 0), &[io], pass(&samples)).unwrap().remove(0);
        assert_eq!(chart.unit, "µs, p99 of each interval (bucket upper bound)");
        assert_eq!(chart.series.len(), 1);
        let (label, points) = &chart.series[0];
        assert_eq!(label, "4242-1-0:1 VP 0");
        // [512, 1024) ns, then no point for the empty interval, then [2^21, 2^22) ns.
        assert_eq!(points, &[(1.0, 1.023), (3.0, 4194.303)]);
    }
}
