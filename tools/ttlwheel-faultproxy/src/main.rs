//! `ttlwheel-faultproxy` for manual use: one link, its faults changed by commands on stdin.
//!
//! `ttlwheel-faultproxy --target 127.0.0.1:7001 [--listen 127.0.0.1:0]` prints
//! `listening on ADDR` and then reads one command a line: `pass` (or `heal`), `cut`,
//! `blackhole [to-target|to-client]`, `stall [to-target|to-client]`, `delay 100ms [dir]`,
//! `throttle BYTES_PER_S [dir]`, `stats`. End of input stops it.

use std::net::SocketAddr;

use clap::Parser;
use tokio::io::{AsyncBufReadExt, BufReader};
use ttlwheel_faultproxy::{Direction, Fault, Link, LinkHandle};

#[derive(Parser, Debug)]
#[command(
    name = "ttlwheel-faultproxy",
    about = "A fault-injecting TCP proxy for one link"
)]
struct Cli {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to connect.
    #[arg(long)]
    target: SocketAddr,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let link = Link::start_on(cli.listen, cli.target).await?;
    println!("listening on {} -> {}", link.addr(), link.target());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        match apply(&link, &line) {
            Ok(answer) => println!("{answer}"),
            Err(error) => eprintln!("error: {error}"),
        }
    }
    link.shutdown().await;
    Ok(())
}

/// Carries out one command; the answer to print, or why the command was not understood.
fn apply(link: &LinkHandle, line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (fault, rest) = match words.as_slice() {
        [] => return Ok(String::new()),
        ["stats"] => return Ok(format!("{:?}", link.stats())),
        ["pass" | "heal", rest @ ..] => (Fault::Pass, rest),
        ["cut", rest @ ..] => (Fault::Cut, rest),
        ["blackhole", rest @ ..] => (Fault::Blackhole, rest),
        ["stall", rest @ ..] => (Fault::Stall, rest),
        ["delay", delay, rest @ ..] => {
            let delay = humantime::parse_duration(delay).map_err(|e| e.to_string())?;
            (Fault::Delay(delay), rest)
        }
        ["throttle", rate, rest @ ..] => {
            let rate: u64 = rate.parse().map_err(|_| format!("not a rate: {rate}"))?;
            let fault = Fault::throttle(rate).ok_or("a rate of 0 is `stall`")?;
            (fault, rest)
        }
        _ => return Err(format!("unknown command: {line}")),
    };
    match rest {
        [] => link.set(fault),
        ["to-target"] => link
            .set_one_way(Direction::ToTarget, fault)
            .map_err(|e| e.to_string())?,
        ["to-client"] => link
            .set_one_way(Direction::ToClient, fault)
            .map_err(|e| e.to_string())?,
        _ => return Err(format!("unknown direction: {}", rest.join(" "))),
    }
    Ok(format!("{:?}", link.faults()))
}
