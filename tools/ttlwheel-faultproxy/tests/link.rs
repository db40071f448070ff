//! The proxy against real sockets: a real echo server on 127.0.0.1:0, real clients, each fault
//! checked for what it does to open connections, new connections, and after healing.
//!
//! Why no paused time here: tokio's auto-advance moves the clock whenever the runtime finds no
//! ready task, and a loopback write is ready at its reader only once the kernel has run the
//! packet through (usually inside the write, but in ksoftirqd on a loaded machine), so a paused
//! clock could jump a delay or a timeout ahead of bytes that are still in flight. What is checked
//! instead holds on any machine: byte counts, ordering, and lower bounds (a delayed or throttled
//! link never delivers early); no test asserts an upper bound on time. `within` only stops a hung
//! test. The throttle's schedule itself is unit-tested with given instants (`fault::Pacer`).

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use ttlwheel_faultproxy::{Direction, Fault, Link, LinkHandle};

/// A hang guard, not a speed assertion: generous for a loaded 2-core machine.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// What the echo server has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct EchoStats {
    /// Connections accepted.
    accepted: u64,
    /// Connections open now.
    open: u64,
    /// Bytes received (and echoed).
    received: u64,
}

/// A real echo server: every byte read is written back; a client's close is answered by a close.
struct Echo {
    addr: SocketAddr,
    stats: watch::Receiver<EchoStats>,
    task: JoinHandle<()>,
}

impl Echo {
    async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stats, stats_rx) = watch::channel(EchoStats::default());
        let task = tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                stats.send_modify(|s| {
                    s.accepted += 1;
                    s.open += 1;
                });
                let stats = stats.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    loop {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                stats.send_modify(|s| s.received += n as u64);
                                if socket.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    drop(socket);
                    stats.send_modify(|s| s.open -= 1);
                });
            }
        });
        Echo {
            addr,
            stats: stats_rx,
            task,
        }
    }

    fn stats(&self) -> EchoStats {
        *self.stats.borrow()
    }

    async fn wait_until(&self, what: &str, done: impl Fn(&EchoStats) -> bool) -> EchoStats {
        let mut stats = self.stats.clone();
        within(what, async { *stats.wait_for(|s| done(s)).await.unwrap() }).await
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo_and_link() -> (Echo, LinkHandle) {
    let echo = Echo::start().await;
    let link = Link::start(echo.addr).await.unwrap();
    (echo, link)
}

/// Writes `bytes` and reads the same number back, checking they are the same.
async fn round_trip(client: &mut TcpStream, bytes: &[u8]) {
    client.write_all(bytes).await.unwrap();
    let mut back = vec![0; bytes.len()];
    within("the echo", client.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(back, bytes);
}

async fn connect(link: &LinkHandle) -> TcpStream {
    TcpStream::connect(link.addr()).await.unwrap()
}

/// Reads until the connection ends, and says how: a reset (RST) or a close (FIN).
async fn read_to_end(client: &mut TcpStream) -> ErrorKind {
    let mut buf = vec![0; 4096];
    within("the connection to end", async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) => return ErrorKind::UnexpectedEof,
                Ok(_) => continue,
                Err(error) => return error.kind(),
            }
        }
    })
    .await
}

/// A pattern whose bytes say their position (mod 251), so a reordering shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn pass_carries_bytes_both_ways_counts_them_and_passes_the_close_on() {
    let (echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    let bytes = pattern(100_000);
    round_trip(&mut client, &bytes).await;

    let stats = link.stats();
    assert_eq!(stats.accepted, 1);
    assert_eq!(stats.connected, 1);
    assert_eq!(stats.to_target.delivered, 100_000);
    assert_eq!(stats.to_client.delivered, 100_000);
    assert_eq!(stats.to_target.dropped + stats.to_client.dropped, 0);

    // The client's FIN reaches the echo server, whose FIN comes back: a clean end, no reset.
    client.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut client).await, ErrorKind::UnexpectedEof);
    echo.wait_until("the echo's side to close", |s| s.open == 0)
        .await;
    let stats = within("the link's side to close", link.wait_until(|s| s.open == 0)).await;
    assert_eq!(stats.reset, 0);
}

#[tokio::test]
async fn cut_resets_open_connections_and_every_new_one_until_healed() {
    let (echo, link) = echo_and_link().await;
    let mut open = connect(&link).await;
    round_trip(&mut open, b"hello").await;

    link.set(Fault::Cut);
    assert_eq!(read_to_end(&mut open).await, ErrorKind::ConnectionReset);
    echo.wait_until("the target's side to be closed", |s| s.open == 0)
        .await;

    // A new connection is accepted (the kernel completes the handshake) and reset at once,
    // without reaching the target.
    let mut refused = connect(&link).await;
    assert_eq!(read_to_end(&mut refused).await, ErrorKind::ConnectionReset);
    assert_eq!(echo.stats().accepted, 1);
    let stats = link.stats();
    assert_eq!(stats.accepted, 2);
    assert_eq!(stats.reset, 2);

    link.heal();
    let mut healed = connect(&link).await;
    round_trip(&mut healed, b"again").await;
    assert_eq!(echo.stats().accepted, 2);
}

#[tokio::test]
async fn blackhole_drops_bytes_both_ways_and_keeps_connections_open() {
    let (echo, link) = echo_and_link().await;
    let mut open = connect(&link).await;
    round_trip(&mut open, b"before").await;

    link.set(Fault::Blackhole);
    open.write_all(&pattern(1_000)).await.unwrap();
    let stats = within(
        "the bytes to be dropped",
        link.wait_until(|s| s.to_target.dropped == 1_000),
    )
    .await;
    assert_eq!(
        stats.to_target.delivered, 6,
        "nothing after the blackhole reached the target"
    );
    assert_eq!(echo.stats().received, 6);
    assert_eq!(
        (stats.open, echo.stats().open),
        (1, 1),
        "the connection stays open"
    );

    // A new connection is accepted, swallows what it is sent, and never reaches the target.
    let mut held = connect(&link).await;
    held.write_all(b"into the void").await.unwrap();
    let stats = within(
        "the new bytes to be dropped",
        link.wait_until(|s| s.to_target.dropped == 1_013),
    )
    .await;
    assert_eq!((stats.accepted, stats.connected, stats.open), (2, 1, 2));
    assert_eq!(echo.stats().accepted, 1);

    // Healed: both connections lost bytes, and TCP never delivers a stream with a hole in it,
    // so both are reset; a new connection passes.
    link.heal();
    assert_eq!(read_to_end(&mut open).await, ErrorKind::ConnectionReset);
    assert_eq!(read_to_end(&mut held).await, ErrorKind::ConnectionReset);
    let mut fresh = connect(&link).await;
    round_trip(&mut fresh, b"after").await;
}

#[tokio::test]
async fn blackhole_in_the_target_direction_also_drops_what_the_target_sends() {
    // A target that talks first (a greeting): with both directions blackholed, its words vanish.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap();
    let link = Link::start(target).await.unwrap();
    let mut client = connect(&link).await;
    let (mut server, _) = within("the target to accept", listener.accept())
        .await
        .unwrap();
    link.set(Fault::Blackhole);
    server.write_all(b"greetings").await.unwrap();
    let stats = within(
        "the greeting to be dropped",
        link.wait_until(|s| s.to_client.dropped == 9),
    )
    .await;
    assert_eq!(stats.to_client.delivered, 0);
    // The client's read sees nothing: the connection is open and silent. Healing resets it.
    link.heal();
    assert_eq!(read_to_end(&mut client).await, ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn a_connection_held_by_a_blackhole_that_sent_nothing_reaches_the_target_when_healed() {
    let (echo, link) = echo_and_link().await;
    link.set(Fault::Blackhole);
    let mut client = connect(&link).await;
    within(
        "the connection to be held",
        link.wait_until(|s| s.open == 1),
    )
    .await;
    assert_eq!(echo.stats().accepted, 0);
    // As a SYN retransmitted after the partition heals: the connection is made then.
    link.heal();
    round_trip(&mut client, b"late but whole").await;
    assert_eq!(echo.stats().accepted, 1);
}

#[tokio::test]
async fn one_way_blackhole_delivers_requests_and_drops_answers() {
    let (echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"ping").await;

    link.set_one_way(Direction::ToClient, Fault::Blackhole)
        .unwrap();
    client.write_all(&pattern(500)).await.unwrap();
    // The target gets the request and answers; the answer vanishes.
    echo.wait_until("the request to arrive", |s| s.received == 504)
        .await;
    let stats = within(
        "the answer to be dropped",
        link.wait_until(|s| s.to_client.dropped == 500),
    )
    .await;
    assert_eq!(stats.to_target.delivered, 504);
    assert_eq!(stats.to_client.delivered, 4);
}

#[tokio::test]
async fn one_way_blackhole_towards_the_target_drops_requests() {
    let (echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"ping").await;

    link.set_one_way(Direction::ToTarget, Fault::Blackhole)
        .unwrap();
    assert_eq!(link.faults().to_client, Fault::Pass);
    client.write_all(&pattern(300)).await.unwrap();
    let stats = within(
        "the request to be dropped",
        link.wait_until(|s| s.to_target.dropped == 300),
    )
    .await;
    assert_eq!(stats.to_target.delivered, 4);
    assert_eq!(echo.stats().received, 4);
}

#[tokio::test]
async fn one_way_cut_is_refused_and_leaves_the_link_as_it_was() {
    let (_echo, link) = echo_and_link().await;
    link.set(Fault::Delay(Duration::from_millis(5)));
    assert!(link.set_one_way(Direction::ToTarget, Fault::Cut).is_err());
    assert_eq!(
        link.faults().to_target,
        Fault::Delay(Duration::from_millis(5))
    );
}

#[tokio::test]
async fn stall_holds_bytes_and_delivers_them_in_order_when_it_lifts() {
    let (echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"x").await;

    link.set(Fault::Stall);
    let bytes = pattern(50_000);
    client.write_all(&bytes).await.unwrap();
    // Absence can only be shown by waiting: a broken stall would pass these bytes in microseconds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(echo.stats().received, 1);
    assert_eq!(link.stats().to_target.delivered, 1);

    link.heal();
    let mut back = vec![0; bytes.len()];
    within("the held bytes", client.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(back, bytes, "every byte, in order");
    round_trip(&mut client, b"still the same connection").await;
    assert_eq!(link.stats().reset, 0);
}

#[tokio::test]
async fn a_connection_made_during_a_stall_reaches_the_target_when_it_lifts() {
    let (echo, link) = echo_and_link().await;
    link.set(Fault::Stall);
    let mut client = connect(&link).await;
    client.write_all(b"sent while stalled").await.unwrap();
    within(
        "the connection to be held",
        link.wait_until(|s| s.open == 1),
    )
    .await;
    assert_eq!(echo.stats().accepted, 0);
    link.heal();
    let mut back = vec![0; 18];
    within("the held bytes", client.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(&back, b"sent while stalled");
}

#[tokio::test]
async fn delay_never_delivers_early_and_keeps_order() {
    let (_echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"warm").await;

    let delay = Duration::from_millis(150);
    link.set(Fault::Delay(delay));
    let started = Instant::now();
    round_trip(&mut client, b"one").await;
    assert!(
        started.elapsed() >= 2 * delay,
        "delayed each way: {:?}",
        started.elapsed()
    );

    // Many small writes in a burst come back whole and in order.
    let started = Instant::now();
    let mut expected = Vec::new();
    for i in 0..200u32 {
        let message = i.to_be_bytes();
        client.write_all(&message).await.unwrap();
        expected.extend_from_slice(&message);
    }
    let mut back = vec![0; expected.len()];
    within("the burst", client.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(back, expected);
    assert!(started.elapsed() >= 2 * delay);
}

#[tokio::test]
async fn one_way_delay_delays_only_its_direction() {
    let (_echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    let delay = Duration::from_millis(200);
    link.set_one_way(Direction::ToTarget, Fault::Delay(delay))
        .unwrap();
    assert_eq!(link.faults().to_client, Fault::Pass);
    let started = Instant::now();
    round_trip(&mut client, b"one way").await;
    assert!(started.elapsed() >= delay);
}

#[tokio::test]
async fn throttle_never_delivers_faster_than_its_rate() {
    let (_echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"warm").await;

    // 40,000 bytes at 100,000 B/s: the last byte cannot arrive before 400 ms.
    link.set_one_way(Direction::ToTarget, Fault::throttle(100_000).unwrap())
        .unwrap();
    let bytes = pattern(40_000);
    let started = Instant::now();
    round_trip(&mut client, &bytes).await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let stats = link.stats();
    assert_eq!(stats.to_target.delivered, 40_004);
    assert_eq!(stats.to_client.delivered, 40_004);
}

#[tokio::test]
async fn a_target_that_refuses_gets_the_client_reset() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = listener.local_addr().unwrap();
    drop(listener);
    let link = Link::start(nowhere).await.unwrap();
    let mut client = connect(&link).await;
    assert_eq!(read_to_end(&mut client).await, ErrorKind::ConnectionReset);
    assert_eq!(link.stats().connected, 0);
}

#[tokio::test]
async fn shutdown_frees_the_port_and_closes_every_connection() {
    let (echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"hello").await;
    let addr = link.addr();

    within("the link to stop", link.shutdown()).await;
    echo.wait_until("the target's side to close", |s| s.open == 0)
        .await;
    let mut buf = [0; 1];
    assert!(
        matches!(client.read(&mut buf).await, Ok(0) | Err(_)),
        "the client's side is closed"
    );
    // The port is free: it can be bound again.
    TcpListener::bind(addr).await.unwrap();
}

#[tokio::test]
async fn dropping_the_handle_ends_every_task_and_frees_the_port() {
    let (echo, link) = echo_and_link().await;
    let mut client = connect(&link).await;
    round_trip(&mut client, b"hello").await;
    let addr = link.addr();

    drop(link);
    echo.wait_until("the target's side to close", |s| s.open == 0)
        .await;
    assert!(matches!(
        read_to_end(&mut client).await,
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
    ));
    // The listener goes with the accept task, which ends soon after the drop.
    within("the port to be free", async {
        while TcpListener::bind(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
}
