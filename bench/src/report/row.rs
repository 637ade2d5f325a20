//! One line of the report's table, how its values are written, and the table's layout.

use serde::Serialize;

pub(super) const MIB: f64 = 1024.0 * 1024.0;

/// One line of the table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// What was measured.
    pub measurement: String,
    /// The bridge's value.
    pub bridge: String,
    /// The ceiling it is compared with.
    pub ceiling: String,
    /// bridge / ceiling.
    pub ratio: String,
    /// The goal, if this line has one.
    pub goal: String,
    /// PASS or MISS when there is a goal.
    pub result: String,
}

impl Row {
    /// A line of the bridge's value alone.
    pub(super) fn shown(measurement: impl Into<String>, bridge: impl Into<String>) -> Self {
        Self {
            measurement: measurement.into(),
            bridge: bridge.into(),
            ..Self::default()
        }
    }

    /// A line of a ceiling alone.
    pub(super) fn ceiling(measurement: impl Into<String>, ceiling: impl Into<String>) -> Self {
        Self {
            measurement: measurement.into(),
            ceiling: ceiling.into(),
            ..Self::default()
        }
    }

    /// A line with a goal and no ceiling: the bridge's value and whether it met the goal.
    pub(super) fn judged(
        measurement: impl Into<String>,
        bridge: impl Into<String>,
        goal: impl Into<String>,
        pass: bool,
    ) -> Self {
        Self {
            measurement: measurement.into(),
            bridge: bridge.into(),
            goal: goal.into(),
            result: verdict(pass),
            ..Self::default()
        }
    }

    /// The bridge's rate `v` next to a ceiling `c`, with no goal.
    pub(super) fn versus(measurement: impl Into<String>, v: f64, c: f64) -> Self {
        Self {
            measurement: measurement.into(),
            bridge: rate(v),
            ceiling: rate(c),
            ratio: percent(v, c),
            ..Self::default()
        }
    }

    /// The bridge's rate `v` against `ceiling` when it was measured: PASS at `min_ratio` of
    /// it or more, the goal reading `goal`.
    pub(super) fn against(
        measurement: impl Into<String>,
        v: f64,
        ceiling: Option<f64>,
        min_ratio: f64,
        goal: &str,
    ) -> Self {
        match ceiling {
            Some(c) => Self {
                goal: goal.into(),
                result: verdict(v >= min_ratio * c),
                ..Self::versus(measurement, v, c)
            },
            None => Self::shown(measurement, rate(v)),
        }
    }
}

pub(super) fn rate(r: f64) -> String {
    format!("{r:.0} msg/s")
}

/// Milliseconds to a tenth.
pub(super) fn millis(v: f64) -> String {
    format!("{v:.1} ms")
}

/// `v` as a whole percentage of `c`.
pub(super) fn percent(v: f64, c: f64) -> String {
    format!("{:.0}%", 100.0 * v / c)
}

pub(super) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB)
}

pub(super) fn verdict(pass: bool) -> String {
    if pass { "PASS" } else { "MISS" }.into()
}

/// The table: a header, then `rows`, each column as wide as its widest cell.
pub(super) fn render(rows: Vec<Row>) -> String {
    let header = Row {
        measurement: "MEASUREMENT".into(),
        bridge: "BRIDGE".into(),
        ceiling: "CEILING".into(),
        ratio: "RATIO".into(),
        goal: "GOAL".into(),
        result: "RESULT".into(),
    };
    let rows: Vec<Row> = std::iter::once(header).chain(rows).collect();
    let cols = |r: &Row| {
        [
            r.measurement.clone(),
            r.bridge.clone(),
            r.ceiling.clone(),
            r.ratio.clone(),
            r.goal.clone(),
            r.result.clone(),
        ]
    };
    let mut width = [0usize; 6];
    for r in &rows {
        for (w, c) in width.iter_mut().zip(cols(r)) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let c = cols(r);
        let line = format!(
            "{:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}  {:<w4$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
            w4 = width[4],
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
