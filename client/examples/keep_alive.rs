//! Keeps a key alive against a local server until Ctrl-C, then deregisters it.
//!
//! ```sh
//! cargo run --release &                                   # a server on 127.0.0.1:7878
//! cargo run -p ttlwheel-client --example keep_alive -- api/host-1:8080 5s
//! ```
//! `TTLWHEEL_ENDPOINT` (comma-separated) and `TTLWHEEL_TOKEN` are read as the CLI reads them.

use std::time::Duration;

use ttlwheel_client::{Client, KeepAlive, Liveness};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let key = args
        .next()
        .unwrap_or_else(|| "example/keep-alive".to_owned());
    let ttl = args
        .next()
        .map(|text| parse_seconds(&text))
        .transpose()?
        .unwrap_or(Duration::from_secs(5));
    let mut builder = Client::builder();
    if let Ok(endpoints) = std::env::var("TTLWHEEL_ENDPOINT") {
        builder = builder.endpoints(endpoints.split(',').map(str::to_owned));
    }
    if let Ok(token) = std::env::var("TTLWHEEL_TOKEN") {
        builder = builder.token(token);
    }
    let client = builder.build()?;

    let mut alive = client
        .keep_alive(&key, KeepAlive::ttl(ttl).service("example"))
        .await?;
    println!(
        "keeping {key} alive (TTL {ttl:?}, a heartbeat every ~{:?}); Ctrl-C to deregister",
        KeepAlive::ttl(ttl).effective_interval()
    );
    let mut changes = alive.watch();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            loss = alive.lost() => println!("lost: {:?}", loss?),
            changed = changes.changed() => {
                changed?;
                let status = changes.borrow_and_update().clone();
                if status.liveness != Liveness::Alive {
                    println!("{:?}: {}", status.liveness, status.last_error.unwrap_or_default());
                }
            }
        }
    }
    alive.shutdown().await?;
    println!("{key} deregistered");
    Ok(())
}

/// `5s` or `5`: seconds.
fn parse_seconds(text: &str) -> Result<Duration, std::num::ParseFloatError> {
    Ok(Duration::from_secs_f64(
        text.trim_end_matches('s').parse::<f64>()?,
    ))
}
