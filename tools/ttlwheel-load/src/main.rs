//! `ttlwheel-load`: the load generator for ttlwheel (and the peers it is compared with).
//!
//! Modes:
//! - `heartbeat`: single heartbeats on random keys over C keep-alive connections; req/s and
//!   latency p50/p99/p999. Closed loop, or open loop with `--rate` (latency counted from each
//!   request's scheduled time, as wrk2 does).
//! - `batch`: the same through `POST /v1/heartbeats/batch`, B keys per request; heartbeats/s.
//! - `soak`: K keys heartbeating every TTL/3 while some stop; every stopped key must expire
//!   exactly once within its window and no other key ever (see [`soak`]).
//! - `storm`: 1M keys expire in the same second under heartbeat load (see [`storm`]).
//! - `redis-expiry`, `etcd-expiry`: the peers' expiry lateness, measured the same way (see
//!   [`peers`]).
//!
//! Results are printed for people, then as one `RESULT {json}` line for scripts
//! (`bench/compare.sh`). The exit status is 1 when a run saw errors or a soak was not clean.

mod creator;
mod driver;
mod peers;
mod receiver;
mod resp;
mod soak;
mod stats;
mod storm;
mod streams;
mod wire;
mod workload;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio::time::Instant;

use driver::{Load, Phases, Workload, STOP};
use wire::Response;
use workload::Ttl;

#[derive(Parser, Debug)]
#[command(
    name = "ttlwheel-load",
    about = "Load generator for ttlwheel and its peers"
)]
struct Cli {
    /// The ttlwheel server (host:port), or the peer for the peer modes.
    #[arg(long, global = true, default_value = "127.0.0.1:7878")]
    target: String,
    /// Threads of the tool's own runtime (1: a single-threaded event loop, like
    /// `redis-benchmark`).
    #[arg(long, global = true, default_value_t = 1)]
    threads: usize,
    /// Seed of the random key choices.
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    /// A ttlwheel token (`ttlw_...`): every request carries it as `Authorization: Bearer`.
    #[arg(long, global = true, env = "TTLWHEEL_TOKEN")]
    token: Option<String>,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Single heartbeats (`POST /v1/heartbeats`) on random keys.
    Heartbeat(LoadArgs),
    /// Batches (`POST /v1/heartbeats/batch?results=errors`) of random keys.
    Batch {
        #[command(flatten)]
        load: LoadArgs,
        /// Heartbeats per request.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Ask for every item's result instead of only the failures.
        #[arg(long)]
        full_results: bool,
    },
    /// Heartbeat every TTL/3 while a fraction of keys stop; count expirations.
    Soak(SoakArgs),
    /// A same-second expiry of many keys under heartbeat load.
    Storm(StormArgs),
    /// Many `GET /v1/events` clients held open (idle, or reading and counting events), to
    /// measure what they cost the server while another load runs.
    Streams(StreamsArgs),
    /// Redis: `SET <prefix><n> 1 EX <ttl>` on random keys, Redis's single heartbeat (for
    /// `--rate` runs beside ttlwheel's; preload the keys yourself, `--no-preload` is implied).
    RedisSet(LoadArgs),
    /// Redis: keys set with `SET k v PX ttl`, expiry seen through keyspace notifications.
    RedisExpiry(peers::ExpiryArgs),
    /// etcd 3.4 (HTTP gateway): keys on leases, lease expiry seen through a watch.
    EtcdExpiry(peers::ExpiryArgs),
}

#[derive(Args, Debug)]
struct LoadArgs {
    /// Distinct keys, chosen at random for each heartbeat.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    #[arg(long, default_value_t = 50)]
    connections: usize,
    #[arg(long, default_value = "30s", value_parser = Ttl::parse)]
    ttl: Ttl,
    /// Measured time.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Load before measuring (not counted).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Do not register every key before the run (the run then creates keys as it goes).
    #[arg(long)]
    no_preload: bool,
    /// Open loop: send this many requests per second in all, each at its scheduled time,
    /// and count latency from that time (as wrk2 does). Without it the load is closed loop.
    #[arg(long, value_parser = positive_rate)]
    rate: Option<f64>,
    /// Renew the keys in order, cycling, instead of at random.
    #[arg(long)]
    sequential: bool,
    #[arg(long, default_value = "load-", value_parser = workload::check_prefix)]
    prefix: String,
    /// Single heartbeats ask for `Prefer: return=minimal`: answered 204 with no body.
    #[arg(long)]
    prefer_minimal: bool,
}

#[derive(Args, Debug)]
struct SoakArgs {
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// TTL of the keys on the wheel path (whole seconds).
    #[arg(long, default_value = "6s", value_parser = Ttl::parse)]
    wheel_ttl: Ttl,
    /// TTL of the keys on the heap path (not whole seconds).
    #[arg(long, default_value = "4500ms", value_parser = Ttl::parse)]
    heap_ttl: Ttl,
    /// Allowed lateness on the wheel path, measured at the receiver (so it includes the request
    /// and the webhook delivery); the wheel expires to the millisecond, like the heap.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    wheel_grace: Duration,
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    heap_grace: Duration,
    #[arg(long, default_value_t = 0.5)]
    heap_fraction: f64,
    #[arg(long, default_value_t = 0.1)]
    stop_fraction: f64,
    /// Connections sending the batches.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    #[command(flatten)]
    receiver: ReceiverArgs,
}

#[derive(Args, Debug)]
struct StormArgs {
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    #[arg(long, default_value = "10s", value_parser = Ttl::parse)]
    ttl: Ttl,
    /// Keys of the background heartbeat load (they must never expire).
    #[arg(long, default_value_t = 100_000)]
    live_keys: u64,
    #[arg(long, default_value_t = 16)]
    live_connections: usize,
    /// Send the background heartbeats open loop at this many per second (all connections
    /// together), latency counted from each scheduled time; without it, closed loop.
    #[arg(long)]
    live_rate: Option<f64>,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    baseline: Duration,
    /// Give up waiting for webhooks this long after the storm starts.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    receiver: ReceiverArgs,
}

#[derive(Args, Debug)]
struct StreamsArgs {
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Read the streams and count their events; without it the clients never read.
    #[arg(long)]
    read: bool,
    /// How long the clients stay connected.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Measure delivery latency: once every stream is open, register this many new keys per
    /// second (single heartbeats, open loop over 4 connections) and time each one's
    /// `registered` event at every client, from the creation's scheduled time to its receipt.
    #[arg(long, requires = "read", value_parser = positive_rate)]
    delivery_rate: Option<f64>,
    /// With `--delivery-rate`: the end of the run with no creations, for the last events to
    /// arrive (creations run for `--duration` less this).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    delivery_drain: Duration,
}

#[derive(Args, Debug)]
struct ReceiverArgs {
    /// Where the tool's webhook receiver listens; start ttlwheel with
    /// `--webhook-url http://<this>/hook`.
    #[arg(long, default_value = "127.0.0.1:9797")]
    receiver: SocketAddr,
}

fn main() {
    let cli = Cli::parse();
    let runtime = if cli.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(cli.threads);
        builder
    }
    .enable_all()
    .build()
    .expect("a tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(error) => {
            eprintln!("ttlwheel-load: {error}");
            std::process::exit(2);
        }
    }
}

/// Runs the mode; `Ok(false)` when it completed but saw errors.
async fn run(cli: Cli) -> Result<bool, String> {
    if let Some(token) = &cli.token {
        wire::authorize(token);
    }
    let target = cli.target;
    match cli.mode {
        Mode::Heartbeat(args) => {
            let workload = Arc::new(SingleHeartbeats {
                host: target.clone(),
                prefix: args.prefix.clone(),
                keys: args.keys,
                ttl: args.ttl,
                order: args.key_order(),
                minimal: args.prefer_minimal,
            });
            run_load(&target, &args, workload, "heartbeat", cli.seed).await
        }
        Mode::RedisSet(mut args) => {
            let workload = Arc::new(peers::RedisSets {
                prefix: args.prefix.clone(),
                keys: args.keys,
                ttl_s: args.ttl.0.as_secs().max(1),
                order: args.key_order(),
            });
            args.no_preload = true;
            run_load(&target, &args, workload, "redis-set", cli.seed).await
        }
        Mode::Batch {
            load,
            batch,
            full_results,
        } => {
            let workload = Arc::new(BatchHeartbeats {
                host: target.clone(),
                path: if full_results {
                    "/v1/heartbeats/batch"
                } else {
                    "/v1/heartbeats/batch?results=errors"
                },
                prefix: load.prefix.clone(),
                keys: load.keys,
                ttl: load.ttl,
                batch,
                order: load.key_order(),
            });
            run_load(&target, &load, workload, "batch", cli.seed).await
        }
        Mode::Soak(args) => {
            let arrivals = start_receiver(&target, &args.receiver).await?;
            let settings = soak::Settings {
                address: target,
                keys: args.keys,
                duration: args.duration,
                wheel: soak::PathSpec {
                    ttl: args.wheel_ttl.0,
                    grace: args.wheel_grace,
                },
                heap: soak::PathSpec {
                    ttl: args.heap_ttl.0,
                    grace: args.heap_grace,
                },
                heap_fraction: args.heap_fraction,
                stop_fraction: args.stop_fraction,
                connections: args.connections,
                // A prefix of this run's own, so that deliveries left over from an earlier run
                // (retried by the server) count as foreign, not as false expirations.
                prefix: format!("soak-{:08x}-", fastrand::u32(..)),
                seed: cli.seed,
            };
            eprintln!("soak: {} keys for {:?}", settings.keys, settings.duration);
            let outcome = soak::run(settings, arrivals).await?;
            let c = &outcome.counts;
            println!(
                "soak: stopped {} | in window {} | late {} | early {} | FALSE {} | duplicate {} | missing {} | pending {}",
                c.stopped, c.in_window, c.late, c.early, c.false_expirations, c.duplicates, c.missing, c.pending
            );
            println!(
                "soak: heartbeats sent {} failed {} | scheduler max lag {:.1} ms",
                outcome.heartbeats_sent, outcome.heartbeats_failed, outcome.max_schedule_lag_ms
            );
            println!("soak: wheel lateness {}", outcome.wheel_lateness);
            println!("soak: heap lateness  {}", outcome.heap_lateness);
            println!(
                "soak: wheel server lateness {}",
                outcome.wheel_server_lateness
            );
            println!(
                "soak: heap server lateness  {}",
                outcome.heap_server_lateness
            );
            print_result("soak", &outcome);
            Ok(outcome.counts.clean() && outcome.heartbeats_failed == 0)
        }
        Mode::Streams(args) => {
            if args.delivery_rate.is_some() && args.delivery_drain >= args.duration {
                return Err("--delivery-drain must be shorter than --duration".into());
            }
            let outcome = streams::run(streams::Settings {
                address: target,
                clients: args.clients,
                read: args.read,
                duration: args.duration,
                delivery: args.delivery_rate.map(|rate| streams::DeliverySettings {
                    rate,
                    drain: args.delivery_drain,
                }),
            })
            .await?;
            println!(
                "streams: {} clients ({}): {} events received (per client {}..{}), {} resets, {} ended early",
                outcome.clients,
                if outcome.read { "reading" } else { "idle" },
                outcome.events,
                outcome.events_min,
                outcome.events_max,
                outcome.resets,
                outcome.ended
            );
            if let Some(delivery) = &outcome.delivery {
                print_delivery(delivery);
            }
            print_result("streams", &outcome);
            Ok(outcome
                .delivery
                .as_ref()
                .is_none_or(streams::DeliveryOutcome::complete))
        }
        Mode::Storm(args) => {
            let arrivals = start_receiver(&target, &args.receiver).await?;
            let settings = storm::Settings {
                address: target,
                keys: args.keys,
                ttl: args.ttl,
                register_connections: 8,
                live_keys: args.live_keys,
                live_connections: args.live_connections,
                live_rate: args.live_rate,
                live_ttl: Ttl(Duration::from_secs(3600)),
                baseline: args.baseline,
                timeout: args.timeout,
                seed: cli.seed,
            };
            let outcome = storm::run(settings, arrivals).await?;
            println!(
                "storm: {} keys given the storm TTL in {:.0} ms; {} expired ({} duplicate, {} FALSE)",
                outcome.keys,
                outcome.renew_ms,
                outcome.expired,
                outcome.duplicates,
                outcome.false_expirations
            );
            println!(
                "storm: expired per second (server clock): {:?}",
                outcome.expired_per_second
            );
            println!(
                "storm: first webhook {:.0} ms, last webhook {:.0} ms after the earliest deadline ({:.0}/s)",
                outcome.first_webhook_ms, outcome.last_webhook_ms, outcome.webhooks_per_s
            );
            println!(
                "storm: heartbeats before {:.0}/s {}",
                outcome.heartbeats_per_s_before, outcome.heartbeat_before
            );
            println!(
                "storm: heartbeats during {:.0}/s {}",
                outcome.heartbeats_per_s_during, outcome.heartbeat_during
            );
            println!(
                "storm: heartbeats during, round trip only (write to answer) {}",
                outcome.round_trip_during
            );
            println!(
                "storm: the sender's own wake-up lag during (not the server's) {}",
                outcome.sender_wake_lag_during
            );
            print_result("storm", &outcome);
            Ok(outcome.expired == outcome.keys
                && outcome.duplicates == 0
                && outcome.false_expirations == 0
                && outcome.heartbeat_errors == 0)
        }
        Mode::RedisExpiry(args) => {
            let outcome = peers::redis_expiry(&target, &args).await?;
            peers::print(&outcome, "redis-expiry");
            Ok(outcome.missing == 0)
        }
        Mode::EtcdExpiry(args) => {
            let outcome = peers::etcd_expiry(&target, &args).await?;
            peers::print(&outcome, "etcd-expiry");
            Ok(outcome.missing == 0)
        }
    }
}

/// The human lines of a `streams --delivery-rate` run.
fn print_delivery(delivery: &streams::DeliveryOutcome) {
    println!(
        "streams: creations {} at {:.0}/s for {:.1} s, {} failed; creation latency {}",
        delivery.creations,
        delivery.rate,
        delivery.seconds,
        delivery.creations_failed,
        delivery.creation_latency
    );
    let latency = &delivery.latency;
    println!(
        "streams: delivery {} of {} (to {} streams), p50 {:.3} p99 {:.3} p999 {:.3} max {:.3} ms (from each creation's scheduled time)",
        delivery.received,
        delivery.expected,
        delivery.streams,
        stats::ms(latency.p50),
        stats::ms(latency.p99),
        stats::ms(latency.p999),
        stats::ms(latency.max)
    );
}

/// Prints a mode's outcome as the one line scripts read.
fn print_result(mode: &str, outcome: &impl serde::Serialize) {
    let json = serde_json::to_string(outcome).expect("outcomes serialize");
    println!("RESULT {{\"mode\":\"{mode}\",\"outcome\":{json}}}");
}

/// Starts the webhook receiver and checks that the server delivers to it.
async fn start_receiver(
    target: &str,
    args: &ReceiverArgs,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<receiver::Arrival>, String> {
    let (address, arrivals) = receiver::start(args.receiver)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.receiver))?;
    let (status, body) = driver::one_request(target, &wire::get(target, "/v1/webhooks"))
        .await
        .map_err(|error| format!("cannot reach {target}: {error}"))?;
    let expected = format!("http://{address}/hook");
    if status != 200 || !String::from_utf8_lossy(&body).contains(&expected) {
        return Err(format!(
            "the server at {target} does not deliver webhooks to this tool: start it with --webhook-url {expected}"
        ));
    }
    Ok(arrivals)
}

impl LoadArgs {
    fn key_order(&self) -> workload::KeyOrder {
        if self.sequential {
            workload::KeyOrder::sequential()
        } else {
            workload::KeyOrder::Random
        }
    }
}

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate.is_finite() => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a positive number of requests per second"
        )),
    }
}

/// A single heartbeat on a key picked by `order`.
pub struct SingleHeartbeats {
    pub host: String,
    pub prefix: String,
    pub keys: u64,
    pub ttl: Ttl,
    pub order: workload::KeyOrder,
    /// Ask for `Prefer: return=minimal` (204, no body).
    pub minimal: bool,
}

impl Workload for SingleHeartbeats {
    fn request(&self, rng: &mut fastrand::Rng, out: &mut Vec<u8>) -> u64 {
        let mut body = Vec::with_capacity(64);
        let key = self.order.next(rng, self.keys);
        workload::write_heartbeat(&mut body, &self.prefix, key, self.ttl);
        let headers: &[u8] = if self.minimal {
            b"Prefer: return=minimal\r\n"
        } else {
            b""
        };
        wire::write_post_head_with(out, &self.host, "/v1/heartbeats", body.len(), headers);
        out.extend_from_slice(&body);
        1
    }

    fn failed(&self, _response: &Response<'_>, _items: u64) -> u64 {
        0 // a 2xx answer is a renewed key
    }
}

/// A batch of heartbeats on keys picked by `order`.
struct BatchHeartbeats {
    host: String,
    path: &'static str,
    prefix: String,
    keys: u64,
    ttl: Ttl,
    batch: usize,
    order: workload::KeyOrder,
}

impl Workload for BatchHeartbeats {
    fn request(&self, rng: &mut fastrand::Rng, out: &mut Vec<u8>) -> u64 {
        let mut body = Vec::with_capacity(self.batch * 40);
        let keys = (0..self.batch).map(|_| (self.order.next(rng, self.keys), self.ttl));
        workload::write_batch(&mut body, &self.prefix, keys);
        wire::write_post_head(out, &self.host, self.path, body.len());
        out.extend_from_slice(&body);
        self.batch as u64
    }

    fn failed(&self, response: &Response<'_>, items: u64) -> u64 {
        workload::failed_items(response.body, items)
    }
}

/// Registers keys `<prefix>0..keys` with `ttl` in batches of 1000 over `connections`
/// connections; fails if any is refused.
pub async fn register(
    address: &str,
    prefix: &str,
    keys: u64,
    ttl: Ttl,
    connections: usize,
) -> Result<(), String> {
    const BATCH: u64 = 1000;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..connections.max(1))
        .map(|_| {
            let (address, prefix, next) =
                (address.to_owned(), prefix.to_owned(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut conn = wire::Conn::connect(&address)
                    .await
                    .map_err(|error| format!("cannot connect to {address}: {error}"))?;
                let mut body = Vec::new();
                loop {
                    let start = next.fetch_add(BATCH, std::sync::atomic::Ordering::Relaxed);
                    if start >= keys {
                        return Ok::<(), String>(());
                    }
                    body.clear();
                    workload::write_batch(
                        &mut body,
                        &prefix,
                        (start..keys.min(start + BATCH)).map(|n| (n, ttl)),
                    );
                    let request =
                        wire::post_json(&address, "/v1/heartbeats/batch?results=errors", &body);
                    let response = conn
                        .exchange(&request)
                        .await
                        .map_err(|error| error.to_string())?;
                    let failed = (response.status == 200)
                        .then(|| workload::failed_positions(response.body).ok())
                        .flatten();
                    if failed.as_ref().is_none_or(|failed| !failed.is_empty()) {
                        return Err(format!(
                            "registering {prefix}{start}..: {} {}",
                            response.status,
                            String::from_utf8_lossy(&response.body[..response.body.len().min(300)])
                        ));
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|error| error.to_string())??;
    }
    Ok(())
}

/// Runs a load mode, closed or open loop (`--rate`): preload, warm up, measure, report.
async fn run_load(
    target: &str,
    args: &LoadArgs,
    workload: Arc<dyn Workload>,
    mode: &str,
    seed: u64,
) -> Result<bool, String> {
    if !args.no_preload {
        let started = Instant::now();
        register(target, &args.prefix, args.keys, args.ttl, 4).await?;
        eprintln!(
            "{mode}: preloaded {} keys in {:.2} s",
            args.keys,
            started.elapsed().as_secs_f64()
        );
    }
    // Phase 0 is the warm-up (counted apart and not reported), phase 1 the measured run.
    const MEASURED: usize = 1;
    let phases = Arc::new(Phases::default());
    let load = Load::start(
        &tokio::runtime::Handle::current(),
        target,
        args.connections,
        2,
        Arc::clone(&phases),
        workload,
        seed,
        args.rate,
    );
    tokio::time::sleep(args.warmup).await;
    phases.set(MEASURED);
    let started = Instant::now();
    tokio::time::sleep(args.duration).await;
    phases.set(STOP);
    let took = started.elapsed();
    let stats = load.finish().await;
    let measured = &stats[MEASURED];
    let outcome = LoadOutcome {
        rate: args.rate,
        connections: args.connections,
        seconds: took.as_secs_f64(),
        requests: measured.requests,
        requests_per_s: measured.requests as f64 / took.as_secs_f64(),
        heartbeats_per_s: measured.items as f64 / took.as_secs_f64(),
        failed_heartbeats: measured.failed_items,
        errors: measured.errors,
        latency: measured.latencies.summary(),
    };
    let looped = match args.rate {
        Some(rate) => format!("open loop at {rate:.0} req/s"),
        None => "closed loop".to_owned(),
    };
    println!(
        "{mode}: {looped}, {} connections, {:.1} s: {:.0} req/s, {:.0} heartbeats/s, {} errors, {} failed heartbeats",
        outcome.connections, outcome.seconds, outcome.requests_per_s, outcome.heartbeats_per_s, outcome.errors, outcome.failed_heartbeats
    );
    let counted_from = if args.rate.is_some() {
        "from each request's scheduled time"
    } else {
        "from each send"
    };
    println!("{mode}: latency ({counted_from}) {}", outcome.latency);
    print_result(mode, &outcome);
    Ok(outcome.errors == 0 && outcome.failed_heartbeats == 0)
}

#[derive(Debug, serde::Serialize)]
struct LoadOutcome {
    /// Requests per second scheduled (open loop), or `None` (closed loop).
    rate: Option<f64>,
    connections: usize,
    seconds: f64,
    requests: u64,
    requests_per_s: f64,
    heartbeats_per_s: f64,
    failed_heartbeats: u64,
    errors: u64,
    latency: stats::Summary,
}
