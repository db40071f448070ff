//! Prometheus metrics (`GET /metrics`, OpenMetrics text) with the `prometheus-client` crate.
//!
//! Two kinds: counters and histograms updated as things happen ([`Metrics`]'s public fields:
//! events, expiry lateness, sweep durations, HTTP requests), and values read at scrape time
//! from their owners ([`Live`]: heartbeats (counted by the registry's shards), keys per timer
//! and per service, ticker lag, stream clients, webhook queues, memory). Label cardinality is bounded: services are the top
//! [`TOP_SERVICES`] by alive keys plus one `(other)` sum; routes are the router's templates;
//! webhook URLs are the configured ones.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use tokio::time::Instant;

use crate::events::{Event, EventKind};
use crate::notify::Notifier;
use crate::registry::Registry;
use crate::routes;
use crate::stream::EventHub;

/// Services shown by name in `ttlwheel_service_keys_alive`; the rest are summed.
pub const TOP_SERVICES: usize = 20;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of an HTTP request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub method: &'static str,
    pub status: u16,
}

/// Labels of an HTTP route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

fn latency_histogram() -> Histogram {
    // 50 µs to ~1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// See the module documentation.
#[derive(Debug)]
pub struct Metrics {
    registry: prometheus_client::registry::Registry,
    pub registrations: Counter,
    pub expirations: Counter,
    pub deletions: Counter,
    pub expiry_lateness: Histogram,
    pub sweep_duration: Histogram,
    pub http_requests: Family<RequestLabels, Counter>,
    /// Request latency by route: one histogram per route of [`routes::ALL`] and a last one for
    /// unmatched requests, resolved at start so that timing a request takes no lock.
    route_durations: Vec<(&'static str, Histogram)>,
}

/// The route label of requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "(unmatched)";

impl Metrics {
    pub fn new(live: Live) -> Self {
        let registrations = Counter::default();
        let expirations = Counter::default();
        let deletions = Counter::default();
        // 1 ms to ~33 s: the heap path is ms-late, the wheel path up to a second, a stalled
        // ticker more.
        let expiry_lateness = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        // 10 µs to ~5 s.
        let sweep_duration = Histogram::new(exponential_buckets(0.000_01, 2.0, 20));
        let http_requests = Family::<RequestLabels, Counter>::default();
        let http_duration = Family::<RouteLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let route_durations = routes::ALL
            .iter()
            .map(|route| route.path)
            .chain([UNMATCHED_ROUTE])
            .map(|route| {
                let histogram = http_duration.get_or_create(&RouteLabels { route }).clone();
                (route, histogram)
            })
            .collect();
        // `register` ends each help text with a full stop of its own: give it none.
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "ttlwheel_registrations",
            "Keys created by a heartbeat",
            registrations.clone(),
        );
        registry.register("ttlwheel_expirations", "Keys expired", expirations.clone());
        registry.register(
            "ttlwheel_deletions",
            "Keys deleted by a client",
            deletions.clone(),
        );
        registry.register(
            "ttlwheel_expiry_lateness_seconds",
            "Time from a key's deadline to its eviction",
            expiry_lateness.clone(),
        );
        registry.register(
            "ttlwheel_sweep_duration_seconds",
            "Duration of one sweep step of the ticker (bounded work)",
            sweep_duration.clone(),
        );
        registry.register(
            "ttlwheel_http_requests",
            "HTTP requests by route template, method and status",
            http_requests.clone(),
        );
        registry.register(
            "ttlwheel_http_request_duration_seconds",
            "HTTP request latency by route template, to the response head",
            http_duration.clone(),
        );
        registry.register_collector(Box::new(live));
        Self {
            registry,
            registrations,
            expirations,
            deletions,
            expiry_lateness,
            sweep_duration,
            http_requests,
            route_durations,
        }
    }

    /// Adds values read at each scrape from another owner (a cluster member's Raft), so that
    /// this module need not know it.
    pub fn add_collector(&mut self, collector: Box<dyn Collector>) {
        self.registry.register_collector(collector);
    }

    /// Counts an event from the registry's bus.
    pub fn observe(&self, event: &Event) {
        match event.kind {
            EventKind::Registered => {
                self.registrations.inc();
            }
            EventKind::Expired => {
                self.expirations.inc();
                self.expiry_lateness
                    .observe(event.lateness_ms as f64 / 1000.0);
            }
            EventKind::Deleted => {
                self.deletions.inc();
            }
            // Counted from the guard's own state at scrape time.
            EventKind::GuardEngaged | EventKind::GuardReleased => {}
        }
    }

    pub fn observe_sweep(&self, took: Duration) {
        self.sweep_duration.observe(took.as_secs_f64());
    }

    /// The index of a route template in `route_durations` (the unmatched slot when it is none
    /// of the routes), for [`Metrics::observe_request`].
    pub fn route_index(&self, template: Option<&str>) -> usize {
        let unmatched = self.route_durations.len() - 1;
        template
            .and_then(|template| {
                self.route_durations[..unmatched]
                    .iter()
                    .position(|(route, _)| *route == template)
            })
            .unwrap_or(unmatched)
    }

    pub fn observe_request(&self, route: usize, method: &'static str, status: u16, took: Duration) {
        let (route, duration) = &self.route_durations[route];
        self.http_requests
            .get_or_create(&RequestLabels {
                route,
                method,
                status,
            })
            .inc();
        duration.observe(took.as_secs_f64());
    }

    /// The exposition, OpenMetrics text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// Values read from their owners at each scrape.
#[derive(Debug)]
pub struct Live {
    pub registry: Arc<Registry>,
    pub notifier: Arc<Notifier>,
    pub hub: Arc<EventHub>,
    pub edge: Arc<crate::edge::EdgeStats>,
}

/// A gauge without labels.
pub(crate) fn gauge1(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter without labels.
pub(crate) fn counter1(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    ConstCounter::new(value).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}

fn gauge<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (&'a [(&'a str, &'a str)], f64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in values {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (&'a [(&'a str, &'a str)], u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in values {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        counter1(
            &mut encoder,
            "ttlwheel_heartbeats",
            "Heartbeats accepted (a batch counts each item).",
            self.registry.heartbeats_total(),
        )?;
        let alive = self.registry.len();
        let (wheel, heap) = self.registry.timer_counts();
        let none = alive.saturating_sub(wheel + heap);
        gauge(
            &mut encoder,
            "ttlwheel_keys_alive",
            "Alive keys by timer (none: no TTL, after PERSIST).",
            [
                (&[("timer", "wheel")][..], wheel as f64),
                (&[("timer", "heap")][..], heap as f64),
                (&[("timer", "none")][..], none as f64),
            ],
        )?;
        self.encode_services(&mut encoder)?;
        gauge1(
            &mut encoder,
            "ttlwheel_ticker_lag_seconds",
            "Seconds between the last fully swept tick and now.",
            crate::ticker::lag_s(&self.registry, now) as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_sse_clients",
            "Connected event-stream clients.",
            self.hub.clients() as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_sse_ring_bytes",
            "Bytes the event-stream ring holds: its blocks of events and their encoded frames (bounded by --events-ring-bytes).",
            self.hub.bytes() as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_sse_ring_events",
            "Events in the event-stream ring (bounded by --events-ring and --events-ring-bytes).",
            self.hub.events() as f64,
        )?;
        counter1(
            &mut encoder,
            "ttlwheel_sse_clients_dropped",
            "Event-stream clients dropped for falling behind the ring.",
            self.hub.dropped_clients(),
        )?;
        counter1(
            &mut encoder,
            "ttlwheel_sse_events_dropped",
            "Events that dropped event-stream clients had not read.",
            self.hub.dropped_events(),
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_service_names",
            "Service names interned (at most 65535 in use; names no key uses are freed when room is needed).",
            self.registry.service_names() as f64,
        )?;
        let (engagements, releases, held, engaged) = self.registry.guard_counts();
        gauge1(
            &mut encoder,
            "ttlwheel_guard_engaged",
            "1 while the mass-expiry guard holds due keys.",
            f64::from(u8::from(engaged)),
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_keys_held",
            "Due keys the mass-expiry guard holds (not expired, no event yet).",
            held as f64,
        )?;
        counter1(
            &mut encoder,
            "ttlwheel_guard_engagements",
            "Times the mass-expiry guard engaged (by its threshold or an operator).",
            engagements,
        )?;
        counter1(
            &mut encoder,
            "ttlwheel_guard_releases",
            "Times a hold of the mass-expiry guard ended (maximum hold, operator, healed).",
            releases,
        )?;
        use std::sync::atomic::Ordering::Relaxed;
        gauge1(
            &mut encoder,
            "ttlwheel_http_connections",
            "Client connections open now.",
            self.edge.open.load(Relaxed) as f64,
        )?;
        counter1(
            &mut encoder,
            "ttlwheel_http_connections_accepted",
            "Client connections accepted since start.",
            self.edge.accepted.load(Relaxed),
        )?;
        counter1(
            &mut encoder,
            "ttlwheel_http_connection_cap_reached",
            "Times the connection cap held accepting back (new connections waited in the backlog).",
            self.edge.capped.load(Relaxed),
        )?;
        let stalls = self.registry.clock().stalls();
        counter1(
            &mut encoder,
            "ttlwheel_stalls",
            "Stalls of the process (it could not run for longer than the slack); every deadline was extended by each.",
            stalls.count,
        )?;
        ConstCounter::new(stalls.total_ms as f64 / 1000.0).encode(encoder.encode_descriptor(
            "ttlwheel_stall_seconds",
            "Time the process was stalled, in all; deadlines were extended by as much.",
            None,
            MetricType::Counter,
        )?)?;
        self.encode_webhooks(&mut encoder, now)?;
        if let Some(journal) = self.registry.journal() {
            let (records, syncs) = journal.counts();
            counter1(
                &mut encoder,
                "ttlwheel_log_records",
                "Records written to the persistence log since start.",
                records,
            )?;
            counter1(
                &mut encoder,
                "ttlwheel_log_syncs",
                "Syncs of the persistence log (records per sync: the group-commit size).",
                syncs,
            )?;
            gauge1(
                &mut encoder,
                "ttlwheel_log_failing",
                "1 while the persistence log cannot be written (changes are refused).",
                f64::from(u8::from(journal.is_failing())),
            )?;
        }
        let rss = resident_bytes();
        gauge1(
            &mut encoder,
            "ttlwheel_process_resident_memory_bytes",
            "Resident memory of the process.",
            rss as f64,
        )?;
        let per_key = if alive == 0 {
            0.0
        } else {
            rss as f64 / alive as f64
        };
        gauge1(
            &mut encoder,
            "ttlwheel_memory_bytes_per_key",
            "Resident memory divided by alive keys (0 without keys).",
            per_key,
        )?;
        Ok(())
    }
}

impl Live {
    fn encode_services(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut counts: Vec<(String, u64)> = self
            .registry
            .service_counts()
            .services
            .into_iter()
            .map(|c| (c.service.as_str().to_owned(), c.alive))
            .collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let other: u64 = counts.iter().skip(TOP_SERVICES).map(|c| c.1).sum();
        counts.truncate(TOP_SERVICES);
        let labels: Vec<[(&str, &str); 1]> = counts
            .iter()
            .map(|(service, _)| [("service", service.as_str())])
            .chain(std::iter::once([("service", "(other)")]))
            .collect();
        let values = counts.iter().map(|c| c.1).chain(std::iter::once(other));
        gauge(
            encoder,
            "ttlwheel_service_keys_alive",
            "Alive keys of the largest services; `(other)` sums the rest.",
            labels.iter().map(|l| &l[..]).zip(values.map(|v| v as f64)),
        )
    }

    fn encode_webhooks(
        &self,
        encoder: &mut DescriptorEncoder,
        now: Instant,
    ) -> Result<(), std::fmt::Error> {
        let status = self.notifier.status(now);
        let mut outcomes = Vec::new();
        for endpoint in &status {
            let c = endpoint.counters;
            for (outcome, value) in [
                ("delivered", c.delivered),
                ("failed", c.failed),
                ("dropped_queue_full", c.dropped_queue_full),
                ("dropped_gone", c.dropped_gone),
            ] {
                outcomes.push((
                    [("url", endpoint.url.as_str()), ("outcome", outcome)],
                    value,
                ));
            }
        }
        counter(
            encoder,
            "ttlwheel_webhook_deliveries",
            "Webhook events by final outcome (failed: moved to the dead letters).",
            outcomes.iter().map(|(labels, value)| (&labels[..], *value)),
        )?;
        let urls: Vec<[(&str, &str); 1]> =
            status.iter().map(|e| [("url", e.url.as_str())]).collect();
        counter(
            encoder,
            "ttlwheel_webhook_failed_attempts",
            "Failed webhook attempts (each retry counts).",
            urls.iter()
                .zip(&status)
                .map(|(l, e)| (&l[..], e.counters.failed_attempts)),
        )?;
        gauge(
            encoder,
            "ttlwheel_webhook_queue_depth",
            "Webhook events held per URL, in flight included.",
            urls.iter()
                .zip(&status)
                .map(|(l, e)| (&l[..], e.pending as f64)),
        )?;
        gauge(
            encoder,
            "ttlwheel_webhook_oldest_pending_seconds",
            "Age of the oldest webhook event held per URL (0 when none).",
            urls.iter()
                .zip(&status)
                .map(|(l, e)| (&l[..], e.oldest_pending_age_ms.unwrap_or(0) as f64 / 1000.0)),
        )?;
        gauge1(
            encoder,
            "ttlwheel_webhook_dead_letters",
            "Dead letters kept.",
            self.notifier.dead_letters().count() as f64,
        )
    }
}

/// Resident set size from `/proc/self/status` (`VmRSS`); 0 where that file does not exist.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(0, |kib| kib * 1024)
}
