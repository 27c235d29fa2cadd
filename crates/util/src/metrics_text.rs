//! Prometheus' text exposition format, written by hand: the hub, the runner and the agent
//! each render a few dozen series, and a histogram is a handful of atomics.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// A Prometheus counter that carries its own name and help, so that what it counts is
/// said where it is declared.
pub struct Counter {
    name: &'static str,
    help: &'static str,
    n: AtomicU64,
}

impl Counter {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            n: AtomicU64::new(0),
        }
    }

    pub fn inc(&self) {
        self.n.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String) {
        let n = self.n.load(Ordering::Relaxed);
        sample(out, self.name, self.help, "counter", n);
    }
}

/// A Prometheus histogram over fixed buckets.
pub struct Histogram {
    bounds: &'static [f64],
    counts: [AtomicU64; 12],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub const fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: [const { AtomicU64::new(0) }; 12],
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        let i = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

/// A label value as the text format wants it.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn gauge(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A series of one unlabelled sample, with its HELP and TYPE lines.
pub fn sample(out: &mut String, name: &str, help: &str, kind: &str, value: impl std::fmt::Display) {
    gauge(out, name, help, kind);
    let _ = writeln!(out, "{name} {value}");
}

pub fn labelled(
    out: &mut String,
    name: &str,
    label: &str,
    values: &std::collections::BTreeMap<String, u64>,
) {
    for (k, v) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {v}", escape(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_into_cumulative_buckets() {
        static H: Histogram = Histogram::new(&[1.0, 10.0]);
        for s in [0.5, 2.0, 20.0, 1.0] {
            H.observe(s);
        }
        let mut out = String::new();
        H.render(&mut out, "x_seconds", "x");
        assert!(out.contains("x_seconds_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"10\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_seconds_count 4\n"), "{out}");
        assert!(out.contains("x_seconds_sum 23.5\n"), "{out}");
    }

    #[test]
    fn a_counter_says_its_name_help_and_count() {
        static C: Counter = Counter::new("x_total", "Things.");
        C.inc();
        C.inc();
        let mut out = String::new();
        C.render(&mut out);
        assert_eq!(
            out,
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total 2\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
