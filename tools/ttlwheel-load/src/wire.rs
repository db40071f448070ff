//! A minimal HTTP/1.1 keep-alive client connection: one request in flight at a time, request
//! bytes prepared by the caller, responses parsed with `httparse` (the parser hyper uses).
//!
//! Why not hyper's or reqwest's client: on a 2-core machine the load tool shares the CPU with
//! the server it measures, so every microsecond the client spends per request is taken from the
//! server. This is what `wrk` and `redis-benchmark` do too: write prepared bytes, read a reply.
//! It supports exactly what the tool needs: `Content-Length` bodies, no chunked encoding, no
//! redirects, no TLS.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most header lines a response may have.
const MAX_HEADERS: usize = 32;

/// The `Authorization` header line every request carries, once `--token` set it.
static AUTHORIZATION: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// Makes every request from now on carry `Authorization: Bearer <token>`.
pub fn authorize(token: &str) {
    let _ = AUTHORIZATION.set(format!("Authorization: Bearer {token}\r\n").into_bytes());
}

fn authorization() -> &'static [u8] {
    AUTHORIZATION.get().map_or(&[], Vec::as_slice)
}

/// A `POST` request with a JSON body, ready to write.
pub fn post_json(host: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut request = Vec::with_capacity(body.len() + 128);
    write_post_head(&mut request, host, path, body.len());
    request.extend_from_slice(body);
    request
}

/// A `GET` request.
pub fn get(host: &str, path: &str) -> Vec<u8> {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n").into_bytes();
    request.extend_from_slice(authorization());
    request.extend_from_slice(b"\r\n");
    request
}

/// Writes the head of a JSON `POST` whose body is `length` bytes long.
pub fn write_post_head(out: &mut Vec<u8>, host: &str, path: &str, length: usize) {
    write_post_head_with(out, host, path, length, b"");
}

/// [`write_post_head`] with more header lines (each ending in `\r\n`).
pub fn write_post_head_with(
    out: &mut Vec<u8>,
    host: &str,
    path: &str,
    length: usize,
    headers: &[u8],
) {
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
    out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(authorization());
    out.extend_from_slice(headers);
    out.extend_from_slice(b"\r\n");
}

/// A response: its status and its body (borrowed from the connection's buffer).
#[derive(Debug)]
pub struct Response<'a> {
    pub status: u16,
    pub body: &'a [u8],
}

/// One keep-alive connection.
pub struct Conn<S = TcpStream> {
    stream: S,
    buffer: Vec<u8>,
    /// Bytes of `buffer` that belong to the previous response, dropped before the next read.
    consumed: usize,
}

impl Conn<TcpStream> {
    /// Opens a connection to `address` (`host:port`).
    pub async fn connect(address: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(Self::new(stream))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            buffer: Vec::with_capacity(16 * 1024),
            consumed: 0,
        }
    }

    /// Sends `request` and reads its response.
    pub async fn exchange(&mut self, request: &[u8]) -> io::Result<Response<'_>> {
        self.stream.write_all(request).await?;
        self.read_response().await
    }

    async fn read_response(&mut self) -> io::Result<Response<'_>> {
        self.buffer.drain(..self.consumed);
        self.consumed = 0;
        let (status, head_len, body_len) = loop {
            if let Some(head) = parse_head(&self.buffer)? {
                break head;
            }
            self.fill().await?;
        };
        while self.buffer.len() < head_len + body_len {
            self.fill().await?;
        }
        self.consumed = head_len + body_len;
        Ok(Response {
            status,
            body: &self.buffer[head_len..head_len + body_len],
        })
    }

    /// Reads more bytes into the buffer; the peer closing is an error (a response was due).
    async fn fill(&mut self) -> io::Result<()> {
        let start = self.buffer.len();
        self.buffer.resize(start + 16 * 1024, 0);
        let read = self.stream.read(&mut self.buffer[start..]).await;
        let read = read.inspect_err(|_| self.buffer.truncate(start))?;
        self.buffer.truncate(start + read);
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        Ok(())
    }
}

/// Parses a response head: `Some((status, head length, body length))` once it is complete.
fn parse_head(bytes: &[u8]) -> io::Result<Option<(u16, usize, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
    };
    let status = response.code.unwrap_or(0);
    let mut body_len = None;
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("content-length") {
            body_len = std::str::from_utf8(header.value)
                .ok()
                .and_then(|value| value.trim().parse::<usize>().ok());
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "chunked responses are not supported by the load tool",
            ));
        }
    }
    // These statuses never have a body (RFC 9110, 6.4.1).
    if status == 204 || status == 304 || (100..200).contains(&status) {
        return Ok(Some((status, head_len, 0)));
    }
    let body_len = body_len.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "response without Content-Length",
        )
    })?;
    Ok(Some((status, head_len, body_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server half that answers each request with the given bytes, written in small pieces
    /// so that the client must reassemble heads and bodies across reads.
    async fn serve(mut server: tokio::io::DuplexStream, answers: Vec<&'static [u8]>) {
        let mut scratch = [0u8; 4096];
        for answer in answers {
            let _ = server.read(&mut scratch).await.unwrap();
            for piece in answer.chunks(7) {
                server.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
        }
    }

    #[tokio::test]
    async fn reads_consecutive_responses_split_across_reads() {
        let (client, server) = tokio::io::duplex(64);
        let answers: Vec<&'static [u8]> = vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
            b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 2\r\n\r\n{}",
        ];
        let server = tokio::spawn(serve(server, answers));
        let mut conn = Conn::new(client);
        let request = post_json("h", "/v1/heartbeats", b"{}");
        let first = conn.exchange(&request).await.unwrap();
        assert_eq!((first.status, first.body), (200, &b"{\"ok\":true}"[..]));
        let second = conn.exchange(&request).await.unwrap();
        assert_eq!((second.status, second.body), (422, &b"{}"[..]));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_closed_connection_is_an_error_not_a_hang() {
        let (client, server) = tokio::io::duplex(64);
        drop(server);
        let mut conn = Conn::new(client);
        assert!(conn.exchange(b"x").await.is_err());
    }

    #[test]
    fn heads_without_a_length_or_with_chunks_are_refused() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_request_head_is_exact() {
        let request = post_json("127.0.0.1:7878", "/v1/heartbeats", b"{\"key\":\"a\"}");
        assert_eq!(
            request,
            b"POST /v1/heartbeats HTTP/1.1\r\nHost: 127.0.0.1:7878\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"key\":\"a\"}"
        );
    }
}
