//! The one Prometheus text parser: samples, summed values and histogram buckets of a scrape.

/// One sample of a Prometheus text scrape: series name, labels in order, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the sample carries every pair in `labels` (and maybe others).
    pub fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// Parses every sample line of a text scrape (label values may hold escaped quotes).
pub fn parse_samples(body: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in body.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, rest) = match series.split_once('{') {
            Some((n, r)) => (n, r.strip_suffix('}').unwrap_or(r)),
            None => (series, ""),
        };
        out.push(Sample {
            name: name.to_string(),
            labels: parse_labels(rest),
            value: parse_value(value),
        });
    }
    out
}

/// A sample value or a bucket bound: a float, `+Inf` or `-Inf` (NaN when it is none of these).
fn parse_value(text: &str) -> f64 {
    match text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or(f64::NAN),
    }
}

/// `k="v",k2="v\"2"` into pairs.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next() != Some('"') {
            break;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => val.extend(chars.next()),
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_string(), val));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

/// Sums the samples of `name` whose labels include every pair in `labels` (0 if there is none).
pub fn metric_value(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    parse_samples(body)
        .iter()
        .filter(|s| s.name == name && s.has(labels) && !s.value.is_nan())
        .fold(0.0, |total, s| total + s.value)
}

/// The cumulative buckets `(le, count)` of a histogram, sorted by `le`, for series matching `labels`.
pub fn histogram_buckets(body: &str, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let bucket = format!("{name}_bucket");
    let mut out: Vec<(f64, f64)> = Vec::new();
    for s in parse_samples(body) {
        if s.name != bucket || !s.has(labels) {
            continue;
        }
        let Some(le) = s.label("le").map(parse_value) else {
            continue;
        };
        assert!(!le.is_nan(), "a bucket bound that is not a number: {s:?}");
        match out.iter_mut().find(|(l, _)| *l == le) {
            Some((_, c)) => *c += s.value,
            None => out.push((le, s.value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The cumulative count of the largest bucket bound not above `le`.
pub fn count_le(buckets: &[(f64, f64)], le: f64) -> f64 {
    buckets
        .iter()
        .rfind(|(b, _)| *b <= le)
        .map_or(0.0, |(_, c)| *c)
}
