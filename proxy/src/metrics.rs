//! The gateway's Prometheus metrics (`GET /metrics`, text format). Labels are bounded: the
//! configured model names (anything else is `unknown`), configured endpoint ids, status
//! classes and a fixed set of error kinds — never prompt text, keys or request ids.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use samewise_store::{RecordSender, RetentionStats};

use crate::routing::{Endpoint, ModelRoute};

/// `model`, `endpoint`, `status_class`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Logical model (or `unknown`).
    pub model: String,
    /// Endpoint id (or `none` for requests answered before routing).
    pub endpoint: String,
    /// `2xx`, `4xx`, `5xx`.
    pub status_class: String,
}

/// `endpoint`, `kind`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Endpoint id.
    pub endpoint: String,
    /// Error kind.
    pub kind: String,
}

/// `model`, `endpoint`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// Logical model.
    pub model: String,
    /// Endpoint id.
    pub endpoint: String,
}

impl EndpointLabels {
    fn of(model: &str, endpoint: &str) -> Self {
        EndpointLabels {
            model: model.to_owned(),
            endpoint: endpoint.to_owned(),
        }
    }
}

/// The model label of a request whose model is not configured.
pub const UNKNOWN_MODEL: &str = "unknown";

/// `model`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Logical model (or `unknown`).
    pub model: String,
}

/// `model`, `endpoint`, `kind`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// Logical model.
    pub model: String,
    /// Endpoint id.
    pub endpoint: String,
    /// `invalid_json`, `unknown_name`, `schema_mismatch`, `finish_mismatch`.
    pub kind: String,
}

/// `model`, `outcome`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CaptureLabels {
    /// Logical model.
    pub model: String,
    /// `queued` (sent to the store with its record) or `too_large` (over `max_body_bytes`).
    pub outcome: String,
}

/// Builds latency histograms: 1 ms .. ~65 s.
#[derive(Debug, Clone, Copy)]
pub struct SecondsBuckets;

impl MetricConstructor<Histogram> for SecondsBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(0.001, 2.0, 17))
    }
}

/// The one Prometheus registry of a samewise process, created at composition (`samewise
/// serve`) and handed to each crate, which registers its own families; `/metrics` renders it.
pub type SharedRegistry = Arc<RwLock<Registry>>;

/// A fresh registry with the `samewise` prefix.
pub fn new_registry() -> SharedRegistry {
    Arc::new(RwLock::new(Registry::with_prefix("samewise")))
}

/// Registers the retention task's series in `shared`, read from `stats` at each scrape:
/// `samewise_retention_passes_total{outcome}` (`ok`, `failed`),
/// `samewise_retention_rows_total{what}` (`records`, `probe_runs`, `rollup_minutes` deleted;
/// `probe_raw`: probe runs whose raw data was cleared), and the last finished pass's end
/// (`samewise_retention_last_pass_timestamp_seconds`, unix time; absent before the first) and
/// longest step (`samewise_retention_last_pass_longest_step_seconds`): a gateway whose
/// retention stopped working shows it here, not only in its log.
pub fn register_retention(shared: &SharedRegistry, stats: Arc<RetentionStats>) {
    let mut registry = shared.write().unwrap_or_else(|p| p.into_inner());
    registry.register_collector(Box::new(RetentionCollector(stats)));
}

#[derive(Debug)]
struct RetentionCollector(Arc<RetentionStats>);

impl Collector for RetentionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        let (ok, failed) = self.0.passes();
        let mut family = encoder.encode_descriptor(
            "retention_passes",
            "Retention passes, by outcome (a failed pass is tried again an hour later)",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in [("ok", ok), ("failed", failed)] {
            ConstCounter::new(n).encode(family.encode_family(&[("outcome", outcome)])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "retention_rows",
            "Rows retention deleted (records, probe_runs, rollup_minutes) or cleared (probe_raw: probe runs whose raw data went)",
            None,
            MetricType::Counter,
        )?;
        for (what, n) in self.0.rows() {
            ConstCounter::new(n).encode(family.encode_family(&[("what", what)])?)?;
        }
        if let Some((ended_ms, longest)) = self.0.last_pass() {
            for (name, help, v) in [
                (
                    "retention_last_pass_timestamp_seconds",
                    "When the last finished retention pass ended, unix time",
                    ended_ms as f64 / 1e3,
                ),
                (
                    "retention_last_pass_longest_step_seconds",
                    "The last finished retention pass's longest step (on SQLite, the longest the record writer waited for it)",
                    longest.as_secs_f64(),
                ),
            ] {
                let g = ConstGauge::new(v);
                let me = encoder.encode_descriptor(name, help, None, g.metric_type())?;
                g.encode(me)?;
            }
        }
        Ok(())
    }
}

/// Every metric the request path updates, and the registry that renders them.
#[derive(Debug)]
pub struct Metrics {
    registry: SharedRegistry,
    /// Client requests answered.
    pub requests: Family<RequestLabels, Counter>,
    /// Failed upstream attempts by kind.
    pub upstream_errors: Family<ErrorLabels, Counter>,
    /// Client request duration (to the last byte).
    pub request_duration: Family<ModelLabels, Histogram, SecondsBuckets>,
    /// Time to first token per endpoint.
    pub ttft: Family<EndpointLabels, Histogram, SecondsBuckets>,
    /// Tool calls that failed a check.
    pub tool_call_errors: Family<ToolLabels, Counter>,
    /// Generations cut by the degeneration guard.
    pub degenerate_cuts: Family<EndpointLabels, Counter>,
    /// Captured bodies of flagged requests, by outcome.
    pub body_captures: Family<CaptureLabels, Counter>,
    /// The handles a request updates, by model and endpoint.
    handles: HashMap<String, ModelHandles>,
}

/// A finished request's status class, the `status_class` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// A 2xx answer that ended well.
    Ok,
    /// A 2xx stream that broke after its head.
    StreamError,
    /// A 4xx.
    ClientError,
    /// A 5xx, or no answer at all.
    ServerError,
}

impl StatusClass {
    /// The class of a final `status` (None: no answer) with or without an error kind.
    pub fn of(status: Option<u16>, errored: bool) -> Self {
        match status {
            Some(s) if (200..300).contains(&s) && !errored => StatusClass::Ok,
            Some(s) if (200..300).contains(&s) => StatusClass::StreamError,
            Some(s) if (400..500).contains(&s) => StatusClass::ClientError,
            _ => StatusClass::ServerError,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusClass::Ok => "2xx",
            StatusClass::StreamError => "stream_error",
            StatusClass::ClientError => "4xx",
            StatusClass::ServerError => "5xx",
        }
    }
}

/// One counter per status class, each taken from its family on first use.
type ByClass = [OnceLock<Counter>; 4];

/// The handles of one configured model (and of `unknown`), resolved in their families on
/// first use and kept: a request then builds no label strings and takes no family lock. A
/// series still appears in `/metrics` only once something is counted in it.
#[derive(Debug, Default)]
struct ModelHandles {
    duration: OnceLock<Histogram>,
    /// Requests answered before any endpoint (`endpoint="none"`).
    unrouted: ByClass,
    /// By endpoint id.
    endpoints: HashMap<String, EndpointHandles>,
}

/// The handles of one endpoint of one model.
#[derive(Debug, Default)]
struct EndpointHandles {
    requests: ByClass,
    ttft: OnceLock<Histogram>,
    degenerate_cuts: OnceLock<Counter>,
}

impl Metrics {
    /// Registers the gateway's families in `shared`; `records` and the endpoints of `models`
    /// are read at each scrape.
    pub fn new(
        records: RecordSender,
        models: &HashMap<String, Arc<ModelRoute>>,
        shared: SharedRegistry,
    ) -> Self {
        let endpoints: Vec<Arc<Endpoint>> = models
            .values()
            .flat_map(|m| m.endpoints.iter().cloned())
            .collect();
        let mut handles: HashMap<String, ModelHandles> = models
            .iter()
            .map(|(name, m)| {
                let endpoints = m
                    .endpoints
                    .iter()
                    .map(|e| (e.id.clone(), EndpointHandles::default()))
                    .collect();
                let model = ModelHandles {
                    endpoints,
                    ..ModelHandles::default()
                };
                (name.clone(), model)
            })
            .collect();
        handles.entry(UNKNOWN_MODEL.to_owned()).or_default();
        let mut guard = shared.write().unwrap_or_else(|p| p.into_inner());
        let registry = &mut *guard;
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Client requests answered, by final status class",
            requests.clone(),
        );
        let upstream_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "upstream_errors",
            "Failed or faulty upstream attempts, by error kind (client disconnects excluded)",
            upstream_errors.clone(),
        );
        let request_duration = Family::new_with_constructor(SecondsBuckets);
        registry.register(
            "request_duration_seconds",
            "Client request duration to the last byte",
            request_duration.clone(),
        );
        let ttft = Family::new_with_constructor(SecondsBuckets);
        registry.register(
            "ttft_seconds",
            "Time to first token per endpoint",
            ttft.clone(),
        );
        let tool_call_errors = Family::<ToolLabels, Counter>::default();
        registry.register(
            "tool_call_errors",
            "Tool calls that failed a check, by kind",
            tool_call_errors.clone(),
        );
        let degenerate_cuts = Family::<EndpointLabels, Counter>::default();
        registry.register(
            "degenerate_cuts",
            "Generations cut by the degeneration guard",
            degenerate_cuts.clone(),
        );
        let body_captures = Family::<CaptureLabels, Counter>::default();
        registry.register(
            "body_captures",
            "Request bodies captured for regression cases (models with capture on), by outcome",
            body_captures.clone(),
        );
        registry.register_collector(Box::new(ScrapeTime { records, endpoints }));
        drop(guard);
        Metrics {
            registry: shared,
            requests,
            upstream_errors,
            request_duration,
            ttft,
            tool_call_errors,
            degenerate_cuts,
            body_captures,
            handles,
        }
    }

    /// Counts a finished request of `model` (a configured name or `unknown`) answered by
    /// `endpoint` (None: before any), and observes its duration.
    pub fn count_request(
        &self,
        model: &str,
        endpoint: Option<&str>,
        class: StatusClass,
        seconds: f64,
    ) {
        let handles = self.handles.get(model);
        let counter = match (handles, endpoint) {
            (Some(h), None) => Some(&h.unrouted),
            (Some(h), Some(e)) => h.endpoints.get(e).map(|e| &e.requests),
            (None, _) => None,
        };
        let labels = || RequestLabels {
            model: model.to_owned(),
            endpoint: endpoint.unwrap_or("none").to_owned(),
            status_class: class.as_str().to_owned(),
        };
        match counter {
            Some(by_class) => by_class[class as usize]
                .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                .inc(),
            None => self.requests.get_or_create(&labels()).inc(),
        };
        let duration = || {
            self.request_duration
                .get_or_create(&ModelLabels {
                    model: model.to_owned(),
                })
                .clone()
        };
        match handles {
            Some(h) => h.duration.get_or_init(duration).observe(seconds),
            None => duration().observe(seconds),
        }
    }

    /// Observes a time to first token of `endpoint` serving `model`.
    pub fn observe_ttft(&self, model: &str, endpoint: &str, seconds: f64) {
        let make = || {
            self.ttft
                .get_or_create(&EndpointLabels::of(model, endpoint))
                .clone()
        };
        match self.endpoint(model, endpoint) {
            Some(h) => h.ttft.get_or_init(make).observe(seconds),
            None => make().observe(seconds),
        }
    }

    /// Counts a generation of `endpoint` serving `model` cut as degenerate.
    pub fn count_degenerate(&self, model: &str, endpoint: &str) {
        let make = || {
            self.degenerate_cuts
                .get_or_create(&EndpointLabels::of(model, endpoint))
                .clone()
        };
        match self.endpoint(model, endpoint) {
            Some(h) => h.degenerate_cuts.get_or_init(make).inc(),
            None => make().inc(),
        };
    }

    fn endpoint(&self, model: &str, endpoint: &str) -> Option<&EndpointHandles> {
        self.handles.get(model)?.endpoints.get(endpoint)
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            tracing::error!("encoding metrics failed");
        }
        out
    }
}

/// Values read at scrape time: the record queue's counters and the breakers.
#[derive(Debug)]
struct ScrapeTime {
    records: RecordSender,
    endpoints: Vec<Arc<Endpoint>>,
}

impl Collector for ScrapeTime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, v) in [
            (
                "record_queue_dropped",
                "Request records dropped because the queue was full",
                self.records.dropped(),
            ),
            (
                "records_written",
                "Request records written to the store",
                self.records.written(),
            ),
            (
                "record_write_errors",
                "Request records lost after every write retry failed",
                self.records.write_errors(),
            ),
            (
                "captured_bodies_dropped",
                "Captured bodies dropped: over the queue's byte bound, queue full, or write failed",
                self.records.bodies_dropped(),
            ),
            (
                "captured_bodies_written",
                "Captured bodies handed to the store",
                self.records.bodies_written(),
            ),
        ] {
            let c = ConstCounter::new(v);
            let me = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(me)?;
        }
        let size = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (name, help, v) in [
            (
                "record_queue_depth",
                "Request records waiting in the queue",
                size(self.records.queued()),
            ),
            (
                "record_queue_bytes",
                "Bytes of the request records waiting to be written: queued or in the batch being gathered (their estimates)",
                size(self.records.queued_bytes()),
            ),
            (
                "record_writer_stalled",
                "1 while the record writer waits for the database (records queue, then are dropped)",
                i64::from(self.records.stalled()),
            ),
        ] {
            let g = ConstGauge::new(v);
            let me = encoder.encode_descriptor(name, help, None, g.metric_type())?;
            g.encode(me)?;
        }

        let mut family = encoder.encode_descriptor(
            "breaker_state",
            "Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for e in &self.endpoints {
            let labels = [("endpoint", e.id.as_str())];
            let g = ConstGauge::new(e.health.breaker_state().as_gauge());
            g.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
