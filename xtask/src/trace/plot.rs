//! `cargo xtask trace FILE --plot out.svg`: a [`Timeline`] drawn with
//! plotters' SVG backend (its built-in font metrics: no system fonts). Per
//! domain two panels on one time axis: the owner CPU over time with moves,
//! parks, violations, the guest's CPU offline/online marks and the PMU's
//! cpumask as the guest read it; then each slot's counter against the
//! injected truth.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::timeline::{DomainTimeline, Timeline};

const WIDTH: u32 = 1400;
const PANEL_HEIGHT: u32 = 280;
/// Where "no owner" sits on the owner panel's CPU axis.
const NO_OWNER_Y: f64 = -1.0;

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
const TRUTH: RGBColor = RGBColor(150, 150, 150);
/// Legend entries of a counter panel, at most.
const MAX_LEGEND: usize = 8;
const COUNTERS: [RGBColor; 4] = [
    RGBColor(40, 90, 200),
    RGBColor(0, 150, 60),
    RGBColor(200, 0, 160),
    RGBColor(150, 110, 0),
];

/// The timeline as an SVG document.
pub fn svg(timeline: &Timeline) -> Result<String> {
    let mut out = String::new();
    let rows = timeline.domains.len().max(1) * 2;
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, PANEL_HEIGHT * rows as u32))
            .into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
        let panels = root.split_evenly((rows, 1));
        let end = timeline.end.max(1.0) * 1.01;
        for (d, dom) in timeline.domains.iter().enumerate() {
            owner_panel(&panels[2 * d], d, dom, end, timeline.dropped)
                .map_err(|e| anyhow!("plot: {e}"))?;
            counter_panel(&panels[2 * d + 1], d, dom, end).map_err(|e| anyhow!("plot: {e}"))?;
        }
        root.present().map_err(|e| anyhow!("plot: {e}"))?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type DrawResult = std::result::Result<(), DrawingAreaErrorKind<std::io::Error>>;

fn owner_panel(
    area: &Area<'_>,
    d: usize,
    dom: &DomainTimeline,
    end: f64,
    dropped: u64,
) -> DrawResult {
    let top = dom.allowed.iter().copied().max().unwrap_or(0).max(1) as f64;
    let mut caption = format!("domain {d}: owner CPU (allowed {:?})", dom.allowed);
    if dropped > 0 {
        caption += &format!(" - trace starts late: {dropped} records dropped");
    }
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(44)
        .build_cartesian_2d(0f64..end, (NO_OWNER_Y - 0.5)..(top + 0.5))?;
    chart
        .configure_mesh()
        .x_desc("time (ms)")
        .y_desc("CPU (-1: none)")
        .y_labels(((top as usize) + 3).min(20))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    // The owner as a step line: each value holds until the next change.
    let mut steps = Vec::new();
    // Before the first change in the trace the owner is that change's `from`.
    let mut now = dom.initial_owner.map_or(NO_OWNER_Y, f64::from);
    steps.push((0.0, now));
    for &(t, owner) in &dom.owner {
        steps.push((t, now));
        now = owner.map_or(NO_OWNER_Y, f64::from);
        steps.push((t, now));
    }
    steps.push((end, now));
    chart
        .draw_series(LineSeries::new(steps, OWNER_LINE.stroke_width(2)))?
        .label("owner")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], OWNER_LINE.stroke_width(2)));
    chart
        .draw_series(
            dom.moves
                .iter()
                .chain(&dom.places)
                .map(|&(t, c)| Circle::new((t, f64::from(c)), 5, MOVE.filled())),
        )?
        .label("placed / moved")
        .legend(|(x, y)| Circle::new((x + 8, y), 5, MOVE.filled()));
    chart
        .draw_series(dom.parks.iter().map(|&t| {
            Rectangle::new(
                [(t, NO_OWNER_Y - 0.15), (t + end / 400.0, NO_OWNER_Y + 0.15)],
                PARK.filled(),
            )
        }))?
        .label("parked")
        .legend(|(x, y)| Rectangle::new([(x + 5, y - 5), (x + 11, y + 5)], PARK.filled()));
    chart
        .draw_series(
            dom.offline
                .iter()
                .map(|&(t, c)| TriangleMarker::new((t, f64::from(c) + 0.25), 5, OFFLINE.filled())),
        )?
        .label("CPU offline")
        .legend(|(x, y)| TriangleMarker::new((x + 8, y), 5, OFFLINE.filled()));
    chart
        .draw_series(
            dom.online
                .iter()
                .map(|&(t, c)| TriangleMarker::new((t, f64::from(c) - 0.25), 5, ONLINE.filled())),
        )?
        .label("CPU online")
        .legend(|(x, y)| TriangleMarker::new((x + 8, y), 5, ONLINE.filled()));
    chart
        .draw_series(dom.cpumask.iter().map(|&(t, c)| {
            Circle::new(
                (t, c.map_or(NO_OWNER_Y, f64::from)),
                8,
                CPUMASK.stroke_width(2),
            )
        }))?
        .label("kernel's cpumask (guest)")
        .legend(|(x, y)| Circle::new((x + 8, y), 6, CPUMASK.stroke_width(2)));
    chart
        .draw_series(dom.interrupts.iter().map(|&(t, c)| {
            Rectangle::new(
                [
                    (t, f64::from(c) - 0.1),
                    (t + end / 800.0, f64::from(c) + 0.1),
                ],
                INTERRUPT.filled(),
            )
        }))?
        .label("interrupt handled (status ack)")
        .legend(|(x, y)| Rectangle::new([(x + 5, y - 4), (x + 11, y + 4)], INTERRUPT.filled()));
    chart
        .draw_series(dom.allowed_changes.iter().map(|(t, _)| {
            PathElement::new(
                vec![(*t, NO_OWNER_Y - 0.5), (*t, top + 0.5)],
                ALLOWED.stroke_width(1),
            )
        }))?
        .label("allowed set changed (host)")
        .legend(|(x, y)| {
            PathElement::new(
                vec![(x + 8, y - 6), (x + 8, y + 6)],
                ALLOWED.stroke_width(1),
            )
        });
    // The violations last, on top of everything, and only they are red.
    chart.draw_series(
        dom.violations
            .iter()
            .map(|&(t, c)| Cross::new((t, f64::from(c)), 6, VIOLATION.stroke_width(2))),
    )?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn counter_panel(area: &Area<'_>, d: usize, dom: &DomainTimeline, end: f64) -> DrawResult {
    let top = dom
        .slots
        .iter()
        .flat_map(|s| s.counter.iter().chain(&s.truth))
        .map(|&(_, b)| b / 1e6)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("domain {d}: slot counters (dots) against the injected truth (grey; queued traffic lands at the max rate)"),
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(44)
        .build_cartesian_2d(0f64..end, 0f64..top * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("time (ms)")
        .y_desc("MB")
        .draw()?;
    // One colour and one legend entry per (slot, event, RMID), however
    // often the driver reassigned it.
    let mut labels: Vec<&str> = Vec::new();
    for series in dom.slots.iter().filter(|s| !s.counter.is_empty()) {
        let truth: Vec<(f64, f64)> = series.truth.iter().map(|&(t, b)| (t, b / 1e6)).collect();
        chart.draw_series(LineSeries::new(truth, TRUTH.stroke_width(4)))?;
        let known = labels.iter().position(|l| *l == series.label);
        let index = known.unwrap_or(labels.len());
        let color = COUNTERS[index % COUNTERS.len()];
        let points: Vec<(f64, f64)> = series.counter.iter().map(|&(t, b)| (t, b / 1e6)).collect();
        let drawn =
            chart.draw_series(LineSeries::new(points, color.stroke_width(1)).point_size(2))?;
        if known.is_none() && labels.len() < MAX_LEGEND {
            labels.push(&series.label);
            drawn
                .label(series.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
    }
    if !labels.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}
