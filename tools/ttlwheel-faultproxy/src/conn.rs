//! One proxied connection: held short of the target while a new handshake could not complete,
//! then two flows (client -> target, target -> client), each a reader that applies its
//! direction's fault to every chunk and a writer that delivers chunks at their time.
//!
//! Invariants: bytes of one direction are delivered in the order they were read (one FIFO queue
//! per direction, one writer); a fault applies to the bytes read after it is set (chunks already
//! queued keep their delivery time); a connection that lost bytes never delivers another one
//! (it is reset when its blackhole lifts); every end other than a clean close on both sides is a
//! reset of both sockets.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::fault::{Direction, Fault, Faults, Pacer};
use crate::stats::Counters;

/// Bytes read at once from a socket.
const READ_CHUNK: usize = 16 * 1024;
/// Chunks queued per direction between reader and writer (up to 1 MiB of 16 KiB reads; under a
/// throttle, 64 pieces of 20 ms): past it the reader waits, so a delayed or throttled link
/// pushes back on its writer as a slow network does.
const QUEUE_CHUNKS: usize = 64;

/// How a flow, or the wait for a route, ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The sending side closed its half and everything was delivered.
    Closed,
    /// The connection must be reset: the link was cut, a blackhole lifted over a hole, an I/O
    /// error, or the link's handle is gone.
    Reset,
}

/// One chunk on its way.
struct Chunk {
    /// When it may be written.
    at: Instant,
    /// The bytes.
    bytes: Vec<u8>,
}

/// Proxies `client` to `target` under `faults` until both sides have closed, or resets both.
pub(crate) async fn serve(
    mut client: TcpStream,
    target: std::net::SocketAddr,
    mut faults: watch::Receiver<Faults>,
    counters: Arc<Counters>,
) {
    let _open = counters.open();
    if await_route(&mut client, &mut faults, &counters).await == End::Reset {
        reset(&client, None, &counters);
        return;
    }
    let upstream = match TcpStream::connect(target).await {
        Ok(upstream) => upstream,
        // The target refuses: so does the link.
        Err(_) => {
            reset(&client, None, &counters);
            return;
        }
    };
    counters.connected();
    // Nagle would hold small writes back and make Delay's and Throttle's timing lumpy.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let end = {
        let out = flow(
            &mut client_read,
            &mut upstream_write,
            Direction::ToTarget,
            faults.clone(),
            &counters,
        );
        let back = flow(
            &mut upstream_read,
            &mut client_write,
            Direction::ToClient,
            faults,
            &counters,
        );
        both_or_reset(out, back).await
    };
    if end == End::Reset {
        reset(
            client_read.as_ref(),
            Some(upstream_read.as_ref()),
            &counters,
        );
        // A write half shuts its side down (FIN) when dropped, and the peer would read a clean
        // end before the reset: forgotten, the socket closes once, with the read half, as RST.
        client_write.forget();
        upstream_write.forget();
    }
}

/// Runs two flows until both close, or until either ends in a reset (the other is dropped).
async fn both_or_reset(
    out: impl std::future::Future<Output = End>,
    back: impl std::future::Future<Output = End>,
) -> End {
    tokio::pin!(out, back);
    let (mut out_done, mut back_done) = (false, false);
    while !(out_done && back_done) {
        let end = tokio::select! {
            end = &mut out, if !out_done => { out_done = true; end }
            end = &mut back, if !back_done => { back_done = true; end }
        };
        if end == End::Reset {
            return End::Reset;
        }
    }
    End::Closed
}

/// Sets SO_LINGER 0 on the sockets so that closing them (their halves are dropped by the
/// caller) sends RST rather than FIN: both ends see the connection reset, at once.
fn reset(client: &TcpStream, upstream: Option<&TcpStream>, counters: &Counters) {
    for socket in std::iter::once(client).chain(upstream) {
        // With a zero linger, close does not block: the kernel discards and resets.
        let _ = socket2::SockRef::from(socket).set_linger(Some(std::time::Duration::ZERO));
    }
    counters.reset();
}

/// Holds a new connection while the link would not let its handshake complete (a blackhole or
/// a stall either way): with a blackhole towards the target, what the client sends is read and
/// dropped. `Closed` when the route opens with nothing lost (the handshake's retransmission
/// would get through now); `Reset` when the link is cut, bytes were lost, the client gave up, or
/// the handle is gone.
async fn await_route(
    client: &mut TcpStream,
    faults: &mut watch::Receiver<Faults>,
    counters: &Counters,
) -> End {
    let mut lost = false;
    let mut buf = vec![0; READ_CHUNK];
    loop {
        let now = *faults.borrow_and_update();
        if now.is_cut() {
            return End::Reset;
        }
        if !now.blocks_handshake() {
            return if lost { End::Reset } else { End::Closed };
        }
        if now.to_target == Fault::Blackhole {
            tokio::select! {
                read = client.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return End::Reset,
                    Ok(n) => {
                        lost = true;
                        counters.dropped(Direction::ToTarget, n);
                    }
                },
                changed = faults.changed() => if changed.is_err() { return End::Reset },
            }
        } else if faults.changed().await.is_err() {
            return End::Reset;
        }
    }
}

/// One direction: `src`'s bytes to `dst` under `direction`'s fault.
async fn flow(
    src: &mut OwnedReadHalf,
    dst: &mut OwnedWriteHalf,
    direction: Direction,
    faults: watch::Receiver<Faults>,
    counters: &Counters,
) -> End {
    let (queue, chunks) = mpsc::channel(QUEUE_CHUNKS);
    let read = read_side(src, queue, direction, faults, counters);
    let write = write_side(dst, chunks, direction, counters);
    tokio::pin!(read, write);
    tokio::select! {
        // Reading ended first: on a reset stop at once; on a close let the writer finish
        // (the queue's sender is gone with the reader, so the writer drains and closes).
        end = &mut read => match end {
            End::Reset => End::Reset,
            End::Closed => write.await,
        },
        // The writer only ends early on an error.
        end = &mut write => end,
    }
}

/// Reads `src` and queues each chunk with its delivery time, or drops it, per the fault.
async fn read_side(
    src: &mut OwnedReadHalf,
    queue: mpsc::Sender<Chunk>,
    direction: Direction,
    mut faults: watch::Receiver<Faults>,
    counters: &Counters,
) -> End {
    let mut lost = false;
    let mut pacer = Pacer::default();
    let mut buf = vec![0; READ_CHUNK];
    loop {
        let fault = faults.borrow_and_update().get(direction);
        if fault == Fault::Cut || (lost && fault != Fault::Blackhole) {
            return End::Reset;
        }
        if fault == Fault::Stall {
            // Not reading leaves the bytes in the kernel: the sender's buffers fill, as on a
            // link that does not acknowledge.
            if faults.changed().await.is_err() {
                return End::Reset;
            }
            continue;
        }
        let n = tokio::select! {
            // Cancel-safe: a read that loses the race has consumed nothing.
            read = src.read(&mut buf) => match read {
                Ok(0) => return End::Closed,
                Ok(n) => n,
                Err(_) => return End::Reset,
            },
            changed = faults.changed() => {
                if changed.is_err() {
                    return End::Reset;
                }
                continue;
            }
        };
        // The fault now, which a stall set during the read holds back until it lifts.
        let fault = loop {
            let fault = faults.borrow_and_update().get(direction);
            if fault != Fault::Stall {
                break fault;
            }
            if faults.changed().await.is_err() {
                return End::Reset;
            }
        };
        if !matches!(fault, Fault::Throttle { .. }) {
            pacer.reset();
        }
        let now = Instant::now();
        let bytes = &buf[..n];
        let sent = match fault {
            Fault::Cut => return End::Reset,
            Fault::Blackhole => {
                lost = true;
                counters.dropped(direction, n);
                true
            }
            Fault::Pass | Fault::Stall => send(&queue, now, bytes).await,
            Fault::Delay(delay) => send(&queue, now + delay, bytes).await,
            Fault::Throttle { bytes_per_s } => {
                let mut sent = true;
                for piece in bytes.chunks(Pacer::piece_len(bytes_per_s)) {
                    let at = pacer.schedule(now, piece.len(), bytes_per_s);
                    sent = sent && send(&queue, at, piece).await;
                }
                sent
            }
        };
        if !sent {
            // The writer is gone (its socket failed): the flow is over.
            return End::Reset;
        }
    }
}

/// Queues `bytes` for delivery at `at`; false when the writer is gone.
async fn send(queue: &mpsc::Sender<Chunk>, at: Instant, bytes: &[u8]) -> bool {
    let chunk = Chunk {
        at,
        bytes: bytes.to_vec(),
    };
    queue.send(chunk).await.is_ok()
}

/// Writes each chunk to `dst` at its time, in order; closes `dst`'s half when the queue ends.
async fn write_side(
    dst: &mut OwnedWriteHalf,
    mut chunks: mpsc::Receiver<Chunk>,
    direction: Direction,
    counters: &Counters,
) -> End {
    while let Some(chunk) = chunks.recv().await {
        tokio::time::sleep_until(chunk.at).await;
        if dst.write_all(&chunk.bytes).await.is_err() {
            return End::Reset;
        }
        counters.delivered(direction, chunk.bytes.len());
    }
    // The sender closed its half: pass the FIN on.
    match dst.shutdown().await {
        Ok(()) => End::Closed,
        Err(_) => End::Reset,
    }
}
