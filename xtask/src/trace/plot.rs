//! `cargo xtask trace FILE --plot out.svg`: a [`Timeline`] drawn with
//! plotters' SVG backend (no system fonts). Lanes on one time axis, in
//! seconds on the device's clock: the checks that ran, as bands; then per
//! domain the owner CPU over time with moves, parks, violations, the
//! guest's CPU offline/online marks and the PMU's cpumask as the guest read
//! it; the kernel events the guest traced on the domain's CPUs (when the
//! trace has any); and one lane per (slot, event, RMID), scaled to its own
//! range, its counter against the injected truth. Every legend sits in a
//! column right of the data, beside its lane.
//!
//! Marks closer than the plot can show apart are thinned ([`thin`],
//! [`spread`]), keeping each pixel column's first, last, lowest and highest
//! value, so that a whole run stays a file a browser opens at once.

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::Ranged;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::timeline::{CheckBand, CounterLane, DomainTimeline, Timeline};

const WIDTH: u32 = 1400;
/// Left of the data: the lanes' y labels.
const Y_LABELS: u32 = 110;
/// Right of the data: the legends.
const LEGEND: u32 = 290;
const MARGIN: u32 = 6;
/// Below a lane that shows the time axis' labels.
const X_LABELS: u32 = 34;
/// The data's width in pixels.
const DATA_WIDTH: u32 = WIDTH - Y_LABELS - LEGEND - 2 * MARGIN;
const TITLE: u32 = 24;
const CHECK_LANE: u32 = 54;
const ROW: u32 = 22;
const COUNTER_LANE: u32 = 64;
const LEGEND_ROW: u32 = 16;
/// Time ticks along the axis, at most.
const MAX_TICKS: usize = 12;
/// Lines keep the extremes of columns this many pixels wide.
const LINE_COLUMN: f64 = 2.0;
/// Counter dots closer than this many pixels are thinned.
const DOT_SPACING: f64 = 4.0;
const FONT: &str = "sans-serif";
/// About the width of a character of the 11-pixel labels.
const CHAR_WIDTH: f64 = 6.4;

const OWNER_LINE: RGBColor = RGBColor(40, 90, 200);
const MOVE: RGBColor = RGBColor(0, 150, 60);
const PARK: RGBColor = RGBColor(0, 0, 0);
/// Violations are the only red marks.
pub const VIOLATION: RGBColor = RGBColor(255, 0, 0);
const OFFLINE: RGBColor = RGBColor(230, 120, 0);
const ONLINE: RGBColor = RGBColor(120, 60, 200);
const CPUMASK: RGBColor = RGBColor(0, 170, 200);
const INTERRUPT: RGBColor = RGBColor(200, 0, 160);
const ALLOWED: RGBColor = RGBColor(110, 110, 0);
const TRUTH: RGBColor = RGBColor(175, 175, 175);
const BAND: [RGBColor; 2] = [RGBColor(214, 230, 250), RGBColor(236, 236, 236)];
const FAILED_BAND: RGBColor = RGBColor(255, 205, 205);
const COUNTERS: [RGBColor; 6] = [
    RGBColor(40, 90, 200),
    RGBColor(0, 140, 60),
    RGBColor(200, 0, 160),
    RGBColor(150, 100, 0),
    RGBColor(0, 140, 150),
    RGBColor(110, 40, 200),
];
const KERNEL: [RGBColor; 4] = [
    RGBColor(0, 120, 120),
    RGBColor(190, 90, 0),
    RGBColor(90, 90, 90),
    RGBColor(150, 0, 90),
];

/// Up to `max` ticks between `lo` and `hi` at a step of 1, 2 or 5 times a
/// power of ten, and the decimals that step needs.
pub fn time_ticks(lo: f64, hi: f64, max: usize) -> (Vec<f64>, usize) {
    let span = (hi - lo).max(1e-9);
    let rough = span / max.max(1) as f64;
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&s| span / s <= max as f64)
        .unwrap_or(10.0 * power);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    // Rounded to the step's decimals, so that 7 steps of 0.1 are 0.7.
    let scale = 10f64.powi(decimals as i32 + 1);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    let ticks = (first..=last)
        .map(|i| (i as f64 * step * scale).round() / scale)
        .filter(|t| (lo..=hi).contains(t))
        .collect();
    (ticks, decimals)
}

/// A tick's label: the time in seconds with the step's decimals.
pub fn tick_label(t: f64, decimals: usize) -> String {
    format!("{t:.decimals$}")
}

/// `points` (in time order) with, of those in each `width`-wide column from
/// `lo`, only the first, the last, the lowest and the highest: at most four
/// a column, and no extreme lost.
pub fn thin(points: &[(f64, f64)], lo: f64, width: f64) -> Vec<(f64, f64)> {
    let column = |t: f64| ((t - lo) / width.max(f64::MIN_POSITIVE)).floor() as i64;
    let mut out = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let c = column(points[i].0);
        let mut j = i;
        while j < points.len() && column(points[j].0) == c {
            j += 1;
        }
        let col = &points[i..j];
        let pick = |better: fn(f64, f64) -> bool| {
            (0..col.len())
                .reduce(|a, b| if better(col[b].1, col[a].1) { b } else { a })
                .unwrap_or(0)
        };
        let mut keep = [0, col.len() - 1, pick(|a, b| a < b), pick(|a, b| a > b)];
        keep.sort_unstable();
        let mut last = None;
        for k in keep {
            if last != Some(k) {
                out.push(col[k]);
                last = Some(k);
            }
        }
        i = j;
    }
    out
}

/// Of the marks at one `y` in each `width`-wide column from `lo`, only the
/// first: the ones drawn over it would not show.
pub fn spread<T: PartialEq + Clone>(marks: &[(f64, T)], lo: f64, width: f64) -> Vec<(f64, T)> {
    let column = |t: f64| ((t - lo) / width.max(f64::MIN_POSITIVE)).floor() as i64;
    let mut seen: Vec<(i64, &T)> = Vec::new();
    let mut out = Vec::new();
    for (t, y) in marks {
        let c = column(*t);
        // Marks come in time order: only this column's can repeat.
        seen.retain(|(sc, _)| *sc == c);
        if !seen.iter().any(|(_, sy)| *sy == y) {
            seen.push((c, y));
            out.push((*t, y.clone()));
        }
    }
    out
}

/// A counter lane's labelled powers of a thousand, at most.
const MAX_LOG_TICKS: usize = 3;
/// Counter lanes are drawn on a log scale from here (a counter's unit is
/// 64 bytes): a lane's y is `log10(bytes / FLOOR_BYTES)`, 0 at and below.
const FLOOR_BYTES: f64 = 64.0;

/// Byte counts as a counter lane's y.
fn log_bytes(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points
        .iter()
        .map(|&(t, b)| (t, (b.max(FLOOR_BYTES) / FLOOR_BYTES).log10()))
        .collect()
}

/// A log lane's ticks (0, then powers of a thousand above the floor: 1 KB,
/// 1 MB, 1 GB..., every second or third of them when there would be more
/// than [`MAX_LOG_TICKS`]) and its top, for counts up to `top` bytes.
fn byte_decades(top: f64) -> (Vec<f64>, f64) {
    let ytop = (top / FLOOR_BYTES).log10().max(1.0) * 1.08;
    // A label too near the lane's 0 would be drawn over it.
    let powers: Vec<f64> = (1..)
        .map(|k| f64::from(3 * k) - FLOOR_BYTES.log10())
        .take_while(|&y| y <= ytop)
        .filter(|&y| y >= 0.15 * ytop)
        .collect();
    let stride = powers.len().div_ceil(MAX_LOG_TICKS).max(1);
    let mut ticks = vec![0.0];
    ticks.extend(powers.iter().rev().step_by(stride).rev());
    (ticks, ytop)
}

/// Of `points`, those at least `dx` across or `dy` up or down from the
/// last one kept (the first always): dots that would not overlap.
pub fn apart(points: &[(f64, f64)], dx: f64, dy: f64) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for &(x, y) in points {
        if out
            .last()
            .is_none_or(|&(lx, ly)| (x - lx).abs() >= dx || (y - ly).abs() >= dy)
        {
            out.push((x, y));
        }
    }
    out
}

/// A byte count in a few characters.
pub fn bytes_label(b: f64) -> String {
    const UNITS: [&str; 9] = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut v = b;
    let mut u = 0;
    while v.abs() >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if v == v.trunc() {
        format!("{v:.0} {}", UNITS[u])
    } else if v.abs() < 10.0 {
        format!("{v:.2} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The legend of one lane: its entries, each a marker and a text.
struct Legend(Vec<(Marker, String)>);

#[derive(Clone, Copy)]
enum Marker {
    Line(RGBColor, u32),
    Dot(RGBColor),
    Ring(RGBColor),
    Bar(RGBColor),
    Tick(RGBColor),
    Up(RGBColor),
    Down(RGBColor),
    Cross(RGBColor),
    Text,
}

impl Legend {
    fn height(&self) -> u32 {
        self.0.len() as u32 * LEGEND_ROW + 10
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = std::result::Result<(), DrawingAreaErrorKind<std::io::Error>>;
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Ticked, Ticked>>;

/// A linear axis whose grid lines and labels sit at the given values
/// (plotters' own `with_key_points` loses the label formatter).
struct Ticked {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = (self.range.end - self.range.start).max(f64::MIN_POSITIVE);
        let share = (value - self.range.start) / span;
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// One lane: how tall, and how to draw it into its area and legend area.
struct Lane<'t> {
    height: u32,
    /// The time labels under it.
    axis: bool,
    kind: LaneKind<'t>,
}

enum LaneKind<'t> {
    Title(String),
    Checks(&'t [CheckBand]),
    Owner(&'t DomainTimeline, Vec<Option<u32>>),
    Kernel(&'t DomainTimeline, Vec<u32>, Vec<String>),
    Counter(CounterLane<'t>),
}

/// The timeline as an SVG document.
pub fn svg(timeline: &Timeline) -> Result<String> {
    let lanes = lanes(timeline);
    let height: u32 = lanes.iter().map(|l| l.height).sum();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
        let mut rest = root;
        for lane in &lanes {
            let (area, below) = rest.split_vertically(lane.height);
            draw_lane(&area, lane, timeline).map_err(|e| anyhow!("plot: {e}"))?;
            rest = below;
        }
    }
    Ok(out)
}

fn lanes(timeline: &Timeline) -> Vec<Lane<'_>> {
    let mut lanes = Vec::new();
    if !timeline.checks.is_empty() {
        lanes.push(Lane {
            height: CHECK_LANE,
            axis: false,
            kind: LaneKind::Checks(&timeline.checks),
        });
    }
    for (d, dom) in timeline.domains.iter().enumerate() {
        let mut title = format!(
            "domain {d} (allowed CPUs {:?}): owner, kernel events, and each counter against the injected truth",
            dom.allowed
        );
        if timeline.dropped > 0 {
            title += &format!(" - trace starts late: {} records dropped", timeline.dropped);
        }
        lanes.push(Lane {
            height: TITLE,
            axis: false,
            kind: LaneKind::Title(title),
        });
        let rows = owner_rows(dom);
        let legend = owner_legend(dom);
        lanes.push(Lane {
            height: (rows.len() as u32 * ROW + ROW / 2 + 16).max(legend.height()) + X_LABELS,
            axis: true,
            kind: LaneKind::Owner(dom, rows),
        });
        if !dom.kernel.is_empty() {
            let mut cpus: Vec<u32> = dom.kernel.iter().map(|e| e.cpu).collect();
            cpus.sort_unstable();
            cpus.dedup();
            let mut events: Vec<String> = Vec::new();
            for e in &dom.kernel {
                if !events.contains(&e.event) {
                    events.push(e.event.clone());
                }
            }
            let legend_rows = events.len() as u32 + 1;
            lanes.push(Lane {
                height: (cpus.len() as u32 * ROW + 16).max(legend_rows * LEGEND_ROW + 10),
                axis: false,
                kind: LaneKind::Kernel(dom, cpus, events),
            });
        }
        for lane in dom.counter_lanes() {
            let legend_rows = lane.entries.len() as u32 + 1;
            lanes.push(Lane {
                height: COUNTER_LANE.max(legend_rows * LEGEND_ROW + 10),
                axis: false,
                kind: LaneKind::Counter(lane),
            });
        }
        if let Some(last) = lanes.last_mut().filter(|l| !l.axis) {
            last.axis = true;
            last.height += X_LABELS;
        }
    }
    lanes
}

/// The owner lane's rows, bottom up: no owner, then every CPU a mark of
/// the domain names.
fn owner_rows(dom: &DomainTimeline) -> Vec<Option<u32>> {
    let mut cpus: Vec<u32> = dom.allowed.clone();
    cpus.extend(dom.initial_owner.flatten());
    cpus.extend(dom.owner.iter().filter_map(|&(_, o)| o));
    for marks in [
        &dom.violations,
        &dom.interrupts,
        &dom.offline,
        &dom.online,
        &dom.moves,
        &dom.places,
    ] {
        cpus.extend(marks.iter().map(|&(_, c)| c));
    }
    cpus.extend(dom.cpumask.iter().filter_map(|&(_, c)| c));
    cpus.sort_unstable();
    cpus.dedup();
    std::iter::once(None)
        .chain(cpus.into_iter().map(Some))
        .collect()
}

fn owner_legend(dom: &DomainTimeline) -> Legend {
    let mut e = vec![(
        Marker::Line(OWNER_LINE, 2),
        "owner CPU (device)".to_string(),
    )];
    let mut add = |present: bool, m: Marker, text: &str| {
        if present {
            e.push((m, text.to_string()));
        }
    };
    add(
        !dom.moves.is_empty() || !dom.places.is_empty(),
        Marker::Dot(MOVE),
        "placed / moved",
    );
    add(!dom.parks.is_empty(), Marker::Bar(PARK), "parked");
    add(
        !dom.offline.is_empty(),
        Marker::Down(OFFLINE),
        "CPU offline done (guest)",
    );
    add(
        !dom.online.is_empty(),
        Marker::Up(ONLINE),
        "CPU online done (guest)",
    );
    add(
        !dom.cpumask.is_empty(),
        Marker::Ring(CPUMASK),
        "kernel's cpumask (guest)",
    );
    add(
        !dom.interrupts.is_empty(),
        Marker::Tick(INTERRUPT),
        "interrupt handled (status ack)",
    );
    add(
        !dom.allowed_changes.is_empty(),
        Marker::Line(ALLOWED, 1),
        "allowed set changed (host)",
    );
    add(
        !dom.violations.is_empty(),
        Marker::Cross(VIOLATION),
        "placement violation",
    );
    Legend(e)
}

fn draw_lane(area: &Area<'_>, lane_spec: &Lane<'_>, tl: &Timeline) -> DrawResult {
    let lane = lane_spec;
    let (data, legend_area) = area.split_horizontally(WIDTH - LEGEND);
    let (start, end) = (tl.start, tl.end.max(tl.start + 1e-6));
    match &lane.kind {
        LaneKind::Title(text) => {
            area.draw(&Text::new(
                text.as_str(),
                (MARGIN as i32, 6),
                (FONT, 14).into_font().style(FontStyle::Bold),
            ))?;
        }
        LaneKind::Checks(bands) => {
            let mut chart = chart(&data, lane, start, end, (0.0, 2.0), vec![])?;
            mesh(&mut chart, lane, &|_| String::new())?;
            draw_checks(&mut chart, bands, start, end)?;
            label(&legend_area, "checks (host), one band each;", 0)?;
            label(&legend_area, "red: failed; zoom with --from/--to", 1)?;
            label_y(&data, "checks")?;
        }
        LaneKind::Owner(dom, rows) => {
            // Room above the top row for its offline marks.
            let top = rows.len() as f64 - 0.1;
            let keys = (0..rows.len()).map(|r| r as f64).collect();
            let mut chart = chart(&data, lane, start, end, (-0.5, top), keys)?;
            let names: Vec<String> = rows
                .iter()
                .map(|r| r.map_or("none".into(), |c| format!("CPU {c}")))
                .collect();
            mesh(&mut chart, lane, &|y| {
                names.get(y.round() as usize).cloned().unwrap_or_default()
            })?;
            draw_owner(&mut chart, dom, rows, start, end)?;
            draw_legend(&legend_area, &owner_legend(dom))?;
        }
        LaneKind::Kernel(dom, cpus, events) => {
            let top = cpus.len() as f64 - 0.5;
            let keys = (0..cpus.len()).map(|r| r as f64).collect();
            let mut chart = chart(&data, lane, start, end, (-0.5, top), keys)?;
            mesh(&mut chart, lane, &|y| {
                cpus.get(y.round() as usize)
                    .map_or(String::new(), |c| format!("CPU {c}"))
            })?;
            let px = (end - start) / f64::from(DATA_WIDTH);
            let marks: Vec<(f64, (usize, usize))> = dom
                .kernel
                .iter()
                .filter_map(|e| {
                    let row = cpus.iter().position(|&c| c == e.cpu)?;
                    let ev = events.iter().position(|n| *n == e.event)?;
                    Some((e.time, (row, ev)))
                })
                .collect();
            chart.draw_series(spread(&marks, start, px).into_iter().map(|(t, (row, ev))| {
                EmptyElement::at((t, row as f64))
                    + Rectangle::new([(0, -7), (1, 7)], KERNEL[ev % KERNEL.len()].filled())
            }))?;
            let mut entries = vec![(Marker::Text, "kernel events (guest tracepoints)".into())];
            entries.extend(
                events
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (Marker::Tick(KERNEL[i % KERNEL.len()]), n.clone())),
            );
            draw_legend(&legend_area, &Legend(entries))?;
            label_y(&data, "")?;
        }
        LaneKind::Counter(lane) => {
            let all = || lane.entries.iter().flat_map(|(_, series)| series.iter());
            let top = all()
                .flat_map(|s| s.counter.iter().chain(&s.truth))
                .map(|&(_, b)| b)
                .fold(FLOOR_BYTES, f64::max);
            let (yticks, ytop) = byte_decades(top);
            let mut chart = chart(&data, lane_spec, start, end, (0.0, ytop), yticks)?;
            mesh(&mut chart, lane_spec, &|y| {
                if *y <= 0.0 {
                    "0".into()
                } else {
                    bytes_label(10f64.powf(*y + FLOOR_BYTES.log10()).round())
                }
            })?;
            let px = (end - start) / f64::from(DATA_WIDTH);
            for s in all() {
                chart.draw_series(LineSeries::new(
                    log_bytes(&thin(&s.truth, start, px * LINE_COLUMN)),
                    TRUTH.stroke_width(4),
                ))?;
            }
            let mut entries = vec![(
                Marker::Line(TRUTH, 4),
                "injected truth (log scale)".to_string(),
            )];
            for (i, (key, series)) in lane.entries.iter().enumerate() {
                let color = COUNTERS[i % COUNTERS.len()];
                for s in series {
                    chart.draw_series(LineSeries::new(
                        log_bytes(&thin(&s.counter, start, px * LINE_COLUMN)),
                        color,
                    ))?;
                    let y_px = ytop / f64::from(COUNTER_LANE);
                    chart.draw_series(
                        apart(&log_bytes(&s.counter), px * DOT_SPACING, y_px * DOT_SPACING)
                            .into_iter()
                            .map(|p| Circle::new(p, 2, color.filled())),
                    )?;
                }
                let label = series.first().map_or(String::new(), |s| s.label.clone());
                debug_assert_eq!(series.first().map(|s| s.key()), Some(*key));
                entries.push((Marker::Line(color, 2), label));
            }
            draw_legend(&legend_area, &Legend(entries))?;
        }
    }
    Ok(())
}

fn chart<'a, 'b>(
    area: &'a Area<'b>,
    lane: &Lane<'_>,
    start: f64,
    end: f64,
    (ylo, yhi): (f64, f64),
    ykeys: Vec<f64>,
) -> std::result::Result<Chart<'a, 'b>, DrawingAreaErrorKind<std::io::Error>> {
    let (ticks, _) = time_ticks(start, end, MAX_TICKS);
    ChartBuilder::on(area)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_top(4)
        .x_label_area_size(if lane.axis { X_LABELS } else { 0 })
        .y_label_area_size(Y_LABELS)
        .build_cartesian_2d(
            Ticked {
                range: start..end,
                ticks,
            },
            Ticked {
                range: ylo..yhi,
                ticks: ykeys,
            },
        )
}

fn mesh(chart: &mut Chart<'_, '_>, lane: &Lane<'_>, y: &dyn Fn(&f64) -> String) -> DrawResult {
    let (start, end) = {
        let r = chart.x_range();
        (r.start, r.end)
    };
    let (_, decimals) = time_ticks(start, end, MAX_TICKS);
    let x = |t: &f64| tick_label(*t, decimals);
    let mut mesh = chart.configure_mesh();
    mesh.max_light_lines(0)
        .bold_line_style(RGBColor(225, 225, 225))
        .x_label_formatter(&x)
        .y_label_formatter(y)
        .label_style((FONT, 11));
    if lane.axis {
        mesh.x_desc("time (s, device clock)");
    } else {
        mesh.x_labels(0);
    }
    mesh.draw()
}

fn label(area: &Area<'_>, text: &str, row: u32) -> DrawResult {
    area.draw(&Text::new(
        text.to_string(),
        (10, 6 + (row * LEGEND_ROW) as i32),
        (FONT, 11),
    ))
}

/// A lane's name left of its y labels.
fn label_y(area: &Area<'_>, text: &str) -> DrawResult {
    area.draw(&Text::new(text.to_string(), (MARGIN as i32, 8), (FONT, 11)))
}

fn draw_legend(area: &Area<'_>, legend: &Legend) -> DrawResult {
    for (i, (marker, text)) in legend.0.iter().enumerate() {
        let y = 12 + (i as u32 * LEGEND_ROW) as i32;
        let at = (20, y);
        match *marker {
            Marker::Line(c, w) => {
                area.draw(&PathElement::new(vec![(10, y), (30, y)], c.stroke_width(w)))?
            }
            Marker::Dot(c) => area.draw(&Circle::new(at, 5, c.filled()))?,
            Marker::Ring(c) => area.draw(&Circle::new(at, 6, c.stroke_width(2)))?,
            Marker::Bar(c) => area.draw(&Rectangle::new([(18, y - 6), (22, y + 6)], c.filled()))?,
            Marker::Tick(c) => {
                area.draw(&Rectangle::new([(19, y - 6), (21, y + 6)], c.filled()))?
            }
            Marker::Up(c) => area.draw(&TriangleMarker::new(at, 5, c.filled()))?,
            Marker::Down(c) => {
                area.draw(&(EmptyElement::at(at) + down_triangle(c)))?;
            }
            Marker::Cross(c) => area.draw(&Cross::new(at, 5, c.stroke_width(2)))?,
            Marker::Text => {}
        }
        let x = if matches!(marker, Marker::Text) {
            10
        } else {
            38
        };
        area.draw(&Text::new(text.clone(), (x, y - 6), (FONT, 11)))?;
    }
    Ok(())
}

fn down_triangle(c: RGBColor) -> Polygon<(i32, i32)> {
    Polygon::new(vec![(-5, -4), (5, -4), (0, 5)], c.filled())
}

/// A band per check span, its names inside it when they fit (odd and even
/// bands on two rows, so that neighbours do not collide).
fn draw_checks(chart: &mut Chart<'_, '_>, bands: &[CheckBand], start: f64, end: f64) -> DrawResult {
    let px_per_s = f64::from(DATA_WIDTH) / (end - start);
    for (i, b) in bands.iter().enumerate() {
        let color = if b.failed > 0 {
            FAILED_BAND
        } else {
            BAND[i % 2]
        };
        let row = if i % 2 == 0 { 1.55 } else { 0.75 };
        // A band that runs past the trace's last record stops at the axis.
        let (from, to) = (b.start.max(start), b.end.min(end));
        if from >= to {
            continue;
        }
        let (low, high) = if i % 2 == 0 { (1.0, 1.95) } else { (0.2, 1.15) };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(from, low), (to, high)],
            color.filled(),
        )))?;
        let text = fit(&b.names, (to - from) * px_per_s - 4.0);
        if !text.is_empty() {
            chart.draw_series(std::iter::once(
                EmptyElement::at((from, row)) + Text::new(text, (2, -6), (FONT, 11)),
            ))?;
        }
    }
    Ok(())
}

/// `names` shortened to fit `width` pixels: all of them, or the first and
/// how many more, or the first cut short; nothing below four characters.
pub fn fit(names: &[String], width: f64) -> String {
    let chars = (width / CHAR_WIDTH).floor().max(0.0) as usize;
    let all = names.join(", ");
    if all.chars().count() <= chars {
        return all;
    }
    let first = names.first().cloned().unwrap_or_default();
    let more = format!("{first} +{}", names.len() - 1);
    if names.len() > 1 && more.chars().count() <= chars {
        return more;
    }
    if chars < 4 {
        return String::new();
    }
    let cut: String = first.chars().take(chars - 1).collect();
    format!("{cut}…")
}

fn draw_owner(
    chart: &mut Chart<'_, '_>,
    dom: &DomainTimeline,
    rows: &[Option<u32>],
    start: f64,
    end: f64,
) -> DrawResult {
    let row = |c: Option<u32>| rows.iter().position(|&r| r == c).unwrap_or(0) as f64;
    let px = (end - start) / f64::from(DATA_WIDTH);
    // The owner as a step line: each value holds until the next change;
    // before the first, only if the trace tells.
    let mut now = dom.initial_owner.map(row);
    let mut steps: Vec<(f64, f64)> = now.map(|y| (start, y)).into_iter().collect();
    for &(t, owner) in &dom.owner {
        steps.extend(now.map(|y| (t, y)));
        let y = row(owner);
        steps.push((t, y));
        now = Some(y);
    }
    steps.extend(now.map(|y| (end, y)));
    chart.draw_series(LineSeries::new(
        thin(&steps, start, px),
        OWNER_LINE.stroke_width(2),
    ))?;
    chart.draw_series(dom.allowed_changes.iter().map(|(t, _)| {
        PathElement::new(
            vec![(*t, -0.5), (*t, rows.len() as f64 - 0.5)],
            ALLOWED.stroke_width(1),
        )
    }))?;
    let placed: Vec<(f64, u32)> = dom.moves.iter().chain(&dom.places).copied().collect();
    chart.draw_series(
        spread(&placed, start, px)
            .into_iter()
            .map(|(t, c)| Circle::new((t, row(Some(c))), 5, MOVE.filled())),
    )?;
    let parks: Vec<(f64, ())> = dom.parks.iter().map(|&t| (t, ())).collect();
    chart.draw_series(spread(&parks, start, px).into_iter().map(|(t, _)| {
        EmptyElement::at((t, row(None))) + Rectangle::new([(-2, -8), (2, 8)], PARK.filled())
    }))?;
    chart.draw_series(spread(&dom.offline, start, px).into_iter().map(|(t, c)| {
        EmptyElement::at((t, row(Some(c))))
            + Polygon::new(vec![(-5, -13), (5, -13), (0, -4)], OFFLINE.filled())
    }))?;
    chart.draw_series(spread(&dom.online, start, px).into_iter().map(|(t, c)| {
        EmptyElement::at((t, row(Some(c)))) + TriangleMarker::new((0, 9), 5, ONLINE.filled())
    }))?;
    chart.draw_series(
        spread(&dom.cpumask, start, px)
            .into_iter()
            .map(|(t, c)| Circle::new((t, row(c)), 8, CPUMASK.stroke_width(2))),
    )?;
    chart.draw_series(
        spread(&dom.interrupts, start, px)
            .into_iter()
            .map(|(t, c)| {
                EmptyElement::at((t, row(Some(c))))
                    + Rectangle::new([(0, -9), (1, -5)], INTERRUPT.filled())
            }),
    )?;
    // The violations last, on top of everything, every one, and only they
    // are red.
    chart.draw_series(
        dom.violations
            .iter()
            .map(|&(t, c)| Cross::new((t, row(Some(c))), 6, VIOLATION.stroke_width(2))),
    )?;
    Ok(())
}
