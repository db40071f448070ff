//! The `ttlwheel` binary: flags to [`Config`], logging, bind, [`ttlwheel::run`]; or, with a
//! subcommand, `token new` or one of the operator's client commands ([`ttlwheel::cli`]).

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;
use ttlwheel::config::{Command, Config, LogFormat, Serving, TokenCommand};

// jemalloc, with background threads that return freed memory to the OS after 1 s
// (`background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0`) and small thread caches
// (`tcache_max:4096,tcache_nslots_small_min:4,tcache_nslots_small_max:4,tcache_nslots_large:1`),
// built in: Cargo.toml and .cargo/config.toml. Why: the allocator's retention is part of what
// a user sees. glibc's malloc crept under steady renewals; mimalloc returns freed pages only
// when the thread that freed them allocates again, so an idle serving thread kept the buffers
// of the batches it had parsed (+100 MB at 100k keys, against +33 MB with jemalloc as
// configured). jemalloc's thread caches are flushed only as their thread allocates, so a
// serving thread idle after a burst kept up to 200 objects per size class and the slabs they
// pin (~0.4 MiB of a 10k-key registration's 3.4 MiB; no batch or single-heartbeat throughput
// difference measured). Figures: BENCHMARKS.md, "Memory at every size" and "Engine III", "The
// fixed cost at 10k keys". `_RJEM_MALLOC_CONF` overrides the settings at run
// time; the `alloc-*` features pick another allocator, for measuring
// (`--no-default-features`: the system's).
ttlwheel::service_allocator!();

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    init_tracing(config.log_format);
    match &config.command {
        Some(Command::Token(TokenCommand::New {
            id,
            scopes,
            description,
        })) => return print_new_token(id, scopes, description),
        // A client of a running server: its exit code says what happened (README, "The CLI").
        Some(Command::Client(command)) => std::process::exit(ttlwheel::cli::run(command.clone())),
        None => {}
    }
    config
        .check_secure_start()
        .map_err(|refusal| anyhow::anyhow!(refusal))?;
    // Per-core serving starts its own threads for connections and the ticker; the main thread's
    // event loop keeps the rest (accepting, webhook delivery, the stream feed).
    let mut runtime = match (config.serving, config.threads) {
        (Serving::PerCore, _) | (Serving::Shared, 1) => {
            tokio::runtime::Builder::new_current_thread()
        }
        (Serving::Shared, 0) => tokio::runtime::Builder::new_multi_thread(),
        (Serving::Shared, threads) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(usize::from(threads));
            builder
        }
    };
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr().context("reading the bound address")?;
    tracing::info!(%address, max_ttl_s = config.max_ttl, default_ttl_s = config.default_ttl, serving = ?config.serving, threads = config.serving_threads(), "ttlwheel listening on http://{address}");
    let placement = ttlwheel::placement(&config).context("starting the serving threads")?;
    let service = ttlwheel::Service::start_member(&config, placement, address)
        .await
        .context("ttlwheel cannot start")?;
    // Under a `Type=notify` systemd unit: READY=1 once recovered (deploy/ttlwheel.service).
    let notifier = tokio::spawn(ttlwheel::systemd::notify_when_ready(service.ready_flag()));
    let served = service.serve(listener, shutdown_signal()).await;
    notifier.abort();
    served.context("ttlwheel cannot go on")?;
    tracing::info!("ttlwheel stopped");
    Ok(())
}

/// `ttlwheel token new`: the token, shown once, and the entry for the token file.
fn print_new_token(
    id: &str,
    scopes: &[ttlwheel::auth::Scope],
    description: &str,
) -> anyhow::Result<()> {
    let (token, entry) = ttlwheel::auth::new_token(id, description, scopes)
        .map_err(|error| anyhow::anyhow!(error))?;
    println!("token (shown once; only its hash goes in the file): {token}");
    println!("add to the \"tokens\" list of the --auth-tokens file, then send SIGHUP to reload:");
    println!("{entry}");
    Ok(())
}

/// Logs to stderr, at `info` unless `RUST_LOG` says otherwise. Text is coloured only when stderr
/// is a terminal: a log redirected to a file or a collector gets no escape codes.
fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
    if let Err(error) = ttlwheel::systemd::notify("STOPPING=1") {
        tracing::warn!(%error, "cannot tell systemd we are stopping");
    }
}
