//! Metrics made and registered in one call, for the registry's families.

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Makes metrics and registers them in its registry; names and labels are constants of this
/// crate, so a bad one is a bug caught by the first test that starts the registry.
pub(crate) struct Make<'a>(pub(crate) &'a Registry);

impl Make<'_> {
    /// `c`, registered (the registry keeps a clone).
    pub(crate) fn registered<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.0.register(Box::new(c.clone())).expect("unique metric");
        c
    }

    /// A counter by `labels`.
    pub(crate) fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.registered(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    /// A counter without labels.
    pub(crate) fn plain_counter(&self, name: &str, help: &str) -> IntCounter {
        self.registered(IntCounter::new(name, help).expect("valid metric"))
    }

    /// A histogram by `labels` with `buckets`.
    pub(crate) fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.registered(HistogramVec::new(opts, labels).expect("valid metric"))
    }

    /// An integer gauge by `labels`.
    pub(crate) fn int_gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.registered(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    /// A float gauge by `labels`.
    pub(crate) fn float_gauge(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.registered(GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }
}
