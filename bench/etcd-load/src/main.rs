//! `etcd-load`: drives etcd 3.4's native gRPC API the way `ttlwheel-load` drives ttlwheel, so
//! that `bench/cluster_vs_etcd.sh` compares the two servers and not two clients.
//!
//! Modes (each closed loop: every connection has one request in flight, as `ttlwheel-load`'s
//! connections do; a warm-up, then the measured time):
//! - `keepalive`: grants `--leases` leases, then renews random ones over `--connections`
//!   HTTP/2 connections, each holding one `Lease/LeaseKeepAlive` stream open (how etcd's
//!   clients renew: `clientv3` keeps one stream and sends a request on it per renewal). The
//!   leader answers from its memory (etcd's lessor), as ttlwheel's leader does for a renewal.
//! - `grant-put`: each connection in turn grants a lease (`Lease/LeaseGrant`) and puts a new
//!   key on it (`KV/Put` with `lease`): etcd's "create a key with a TTL", two proposals
//!   committed on a quorum (each fsynced to its WAL) before the answer. One key per lease, as
//!   each ttlwheel key has its own deadline.
//!
//! No protoc: the messages below are etcd's (`api/etcdserverpb/rpc.proto` at v3.4, field
//! numbers as there), written with prost's derive and called through tonic's generic client.
//! The `RESULT {json}` line has the shape `bench/lib.sh`'s `result` reads
//! (`outcome.requests_per_s`, `outcome.latency.p50_ms`, ...).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use tokio::time::Instant;
use tonic::codec::ProstCodec;
use tonic::transport::{Channel, Endpoint};

/// etcd 3.4's messages (only the fields used; prost skips the others on decode).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantRequest {
        #[prost(int64, tag = "1")]
        pub ttl: i64,
        #[prost(int64, tag = "2")]
        pub id: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantResponse {
        #[prost(int64, tag = "2")]
        pub id: i64,
        #[prost(int64, tag = "3")]
        pub ttl: i64,
        #[prost(string, tag = "4")]
        pub error: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseKeepAliveRequest {
        #[prost(int64, tag = "1")]
        pub id: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseKeepAliveResponse {
        #[prost(int64, tag = "2")]
        pub id: i64,
        #[prost(int64, tag = "3")]
        pub ttl: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub lease: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {}
}

const GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
const KEEPALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
const PUT: &str = "/etcdserverpb.KV/Put";

#[derive(Parser, Debug)]
#[command(name = "etcd-load", about = "Load generator for etcd's gRPC API")]
struct Cli {
    /// The etcd member to load (its client URL): the leader, as the ttlwheel runs load theirs.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    endpoint: String,
    /// Threads of the tool's runtime (1: one event loop, as `ttlwheel-load` by default).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// HTTP/2 connections, one request in flight on each.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// TTL of the leases granted, in seconds.
    #[arg(long, default_value_t = 600)]
    ttl: i64,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Keep-alives of random leases, one stream per connection.
    Keepalive {
        /// Leases granted before the run (not measured), renewed at random.
        #[arg(long, default_value_t = 100_000)]
        leases: usize,
    },
    /// Lease grant, then a put of a new key on that lease, in turn on each connection.
    GrantPut {
        /// Prefix of the keys put (each run its own, so that puts create keys).
        #[arg(long, default_value = "etcd-load/")]
        prefix: String,
    },
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
    if let Err(error) = runtime.block_on(run(cli)) {
        eprintln!("etcd-load: {error}");
        std::process::exit(2);
    }
}

/// What the measured phase counts, shared by the connections.
struct Counts {
    /// 0: warm-up, 1: measured, 2: stop.
    phase: AtomicUsize,
    done: AtomicU64,
    errors: AtomicU64,
}

const WARMUP: usize = 0;
const MEASURED: usize = 1;
const STOP: usize = 2;

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn run(cli: Cli) -> Result<(), Error> {
    let channels = connect(&cli.endpoint, cli.connections).await?;
    let counts = Arc::new(Counts {
        phase: AtomicUsize::new(WARMUP),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let mode = match &cli.mode {
        Mode::Keepalive { .. } => "keepalive",
        Mode::GrantPut { .. } => "grant-put",
    };
    let workers: Vec<tokio::task::JoinHandle<Histogram<u64>>> = match cli.mode {
        Mode::Keepalive { leases } => {
            let started = Instant::now();
            let ids = Arc::new(grant_all(&channels, leases, cli.ttl).await?);
            eprintln!(
                "keepalive: granted {leases} leases in {:.2} s",
                started.elapsed().as_secs_f64()
            );
            channels
                .into_iter()
                .enumerate()
                .map(|(n, channel)| {
                    let (ids, counts) = (Arc::clone(&ids), Arc::clone(&counts));
                    tokio::spawn(keepalive_loop(channel, ids, counts, n as u64))
                })
                .collect()
        }
        Mode::GrantPut { prefix } => channels
            .into_iter()
            .enumerate()
            .map(|(n, channel)| {
                let prefix = format!("{prefix}{n}/");
                tokio::spawn(grant_put_loop(
                    channel,
                    prefix,
                    cli.ttl,
                    Arc::clone(&counts),
                ))
            })
            .collect(),
    };
    tokio::time::sleep(cli.warmup).await;
    counts.phase.store(MEASURED, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(cli.duration).await;
    counts.phase.store(STOP, Ordering::SeqCst);
    let seconds = started.elapsed().as_secs_f64();
    let done = counts.done.load(Ordering::SeqCst);
    let errors = counts.errors.load(Ordering::SeqCst);
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for worker in workers {
        latency.add(worker.await?)?;
    }
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    let rate = done as f64 / seconds;
    println!(
        "{mode}: closed loop, {} connections, {seconds:.1} s: {rate:.0}/s, {errors} errors; latency p50 {:.3} ms p99 {:.3} ms p999 {:.3} ms max {:.3} ms",
        cli.connections,
        ms(0.5),
        ms(0.99),
        ms(0.999),
        latency.max() as f64 / 1000.0
    );
    let outcome = serde_json::json!({
        "connections": cli.connections,
        "seconds": seconds,
        "requests": done,
        "requests_per_s": rate,
        "errors": errors,
        "latency": {"p50_ms": ms(0.5), "p99_ms": ms(0.99), "p999_ms": ms(0.999)},
    });
    println!("RESULT {{\"mode\":\"{mode}\",\"outcome\":{outcome}}}");
    if errors > 0 {
        return Err(format!("{errors} requests failed").into());
    }
    Ok(())
}

/// `count` HTTP/2 connections to `endpoint` (each its own channel: tonic multiplexes a
/// channel's calls over one connection).
async fn connect(endpoint: &str, count: usize) -> Result<Vec<Channel>, Error> {
    let endpoint = Endpoint::from_shared(endpoint.to_owned())?.tcp_nodelay(true);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

/// A unary call of `path` on `channel`.
async fn unary<Q, A>(channel: &Channel, path: &'static str, request: Q) -> Result<A, tonic::Status>
where
    Q: prost::Message + Send + Sync + 'static,
    A: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    let answer = grpc
        .unary(tonic::Request::new(request), path, ProstCodec::default())
        .await?;
    Ok(answer.into_inner())
}

async fn grant(channel: &Channel, ttl: i64) -> Result<i64, Error> {
    let answer: pb::LeaseGrantResponse =
        unary(channel, GRANT, pb::LeaseGrantRequest { ttl, id: 0 }).await?;
    if !answer.error.is_empty() || answer.id == 0 {
        return Err(format!("lease grant refused: {:?}", answer.error).into());
    }
    Ok(answer.id)
}

/// Grants `leases` leases over all connections at once (not measured).
async fn grant_all(channels: &[Channel], leases: usize, ttl: i64) -> Result<Vec<i64>, Error> {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = channels
        .iter()
        .cloned()
        .map(|channel| {
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < leases {
                    ids.push(grant(&channel, ttl).await?);
                }
                Ok::<_, Error>(ids)
            })
        })
        .collect();
    let mut ids = Vec::with_capacity(leases);
    for task in tasks {
        ids.extend(task.await??);
    }
    Ok(ids)
}

/// Renews random leases of `ids` on one keep-alive stream, one request in flight.
async fn keepalive_loop(
    channel: Channel,
    ids: Arc<Vec<i64>>,
    counts: Arc<Counts>,
    seed: u64,
) -> Histogram<u64> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (sender, requests) = tokio::sync::mpsc::channel::<pb::LeaseKeepAliveRequest>(1);
    let mut grpc = tonic::client::Grpc::new(channel);
    let opened = async {
        grpc.ready()
            .await
            .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
        grpc.streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(requests)),
            tonic::codegen::http::uri::PathAndQuery::from_static(KEEPALIVE),
            ProstCodec::<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>::default(),
        )
        .await
    };
    // The stream's headers come only once the first request is sent: send it first.
    let first = pb::LeaseKeepAliveRequest {
        id: ids[rng.usize(..ids.len())],
    };
    let mut sent_at = Instant::now();
    if sender.send(first).await.is_err() {
        counts.errors.fetch_add(1, Ordering::Relaxed);
        return latency;
    }
    let mut answers = match opened.await {
        Ok(answers) => answers.into_inner(),
        Err(_) => {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            return latency;
        }
    };
    loop {
        let answer = answers.message().await;
        let phase = counts.phase.load(Ordering::Relaxed);
        match answer {
            Ok(Some(answer)) if answer.ttl > 0 => {
                if phase == MEASURED {
                    counts.done.fetch_add(1, Ordering::Relaxed);
                    latency.saturating_record(sent_at.elapsed().as_micros().max(1) as u64);
                }
            }
            _ => {
                // A lease not found (TTL <= 0) or a broken stream: counted, and this
                // connection stops (its stream cannot be trusted any more).
                if phase != STOP {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                }
                return latency;
            }
        }
        if phase == STOP {
            return latency;
        }
        sent_at = Instant::now();
        let id = ids[rng.usize(..ids.len())];
        if sender.send(pb::LeaseKeepAliveRequest { id }).await.is_err() {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            return latency;
        }
    }
}

/// Grants a lease and puts a new key on it, in turn, until told to stop.
async fn grant_put_loop(
    channel: Channel,
    prefix: String,
    ttl: i64,
    counts: Arc<Counts>,
) -> Histogram<u64> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds");
    for n in 0u64.. {
        let phase = counts.phase.load(Ordering::Relaxed);
        if phase == STOP {
            break;
        }
        let started = Instant::now();
        let created = async {
            let lease = grant(&channel, ttl).await?;
            let put = pb::PutRequest {
                key: format!("{prefix}{n}").into_bytes(),
                value: b"1".to_vec(),
                lease,
            };
            let _: pb::PutResponse = unary(&channel, PUT, put).await?;
            Ok::<_, Error>(())
        }
        .await;
        // Counted in the phase it started in (a request that straddles the end is not).
        match created {
            Ok(()) if phase == MEASURED && counts.phase.load(Ordering::Relaxed) == MEASURED => {
                counts.done.fetch_add(1, Ordering::Relaxed);
                latency.saturating_record(started.elapsed().as_micros().max(1) as u64);
            }
            Ok(()) => {}
            Err(error) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("grant-put: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    latency
}
