//! A small RESP (Redis protocol) codec and connection: commands out, replies in, as far as
//! this tool needs them. A leaf: the driver speaks it for Redis workloads (`Protocol::Resp`) and
//! the peers' measurements speak it to Redis, so neither has to import the other for it.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A RESP command: an array of bulk strings.
pub fn command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
}

/// A RESP value, as far as this tool reads them.
#[derive(Debug, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Resp>),
}

/// Parses one value from the front of `bytes`: `Some((value, length))` when complete.
pub fn parse(bytes: &[u8]) -> Result<Option<(Resp, usize)>, String> {
    let Some(line_end) = bytes.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = std::str::from_utf8(&bytes[1..line_end]).map_err(|e| e.to_string())?;
    let after = line_end + 2;
    let number = || {
        line.parse::<i64>()
            .map_err(|e| format!("bad RESP length {line:?}: {e}"))
    };
    match bytes.first() {
        Some(b'+') => Ok(Some((Resp::Simple(line.into()), after))),
        Some(b'-') => Ok(Some((Resp::Error(line.into()), after))),
        Some(b':') => Ok(Some((Resp::Integer(number()?), after))),
        Some(b'$') => {
            let length = number()?;
            if length < 0 {
                return Ok(Some((Resp::Bulk(None), after)));
            }
            let end = after + length as usize;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            Ok(Some((
                Resp::Bulk(Some(bytes[after..end].to_vec())),
                end + 2,
            )))
        }
        Some(b'*') => {
            let mut items = Vec::new();
            let mut at = after;
            for _ in 0..number()?.max(0) {
                let Some((item, used)) = parse(&bytes[at..])? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            Ok(Some((Resp::Array(items), at)))
        }
        _ => Err(format!(
            "not RESP: {:?}",
            String::from_utf8_lossy(&bytes[..after])
        )),
    }
}

/// A RESP connection.
pub struct RespConn {
    /// The connection to the server (Nagle off: commands go out at once).
    stream: TcpStream,
    /// Bytes read and not yet parsed into a reply.
    buffer: Vec<u8>,
}

impl RespConn {
    pub async fn connect(address: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|error| format!("cannot connect to Redis at {address}: {error}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Self {
            stream,
            buffer: Vec::new(),
        })
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| e.to_string())
    }

    pub async fn read(&mut self) -> Result<Resp, String> {
        loop {
            if let Some((value, used)) = parse(&self.buffer)? {
                self.buffer.drain(..used);
                return Ok(value);
            }
            let mut chunk = [0u8; 16 * 1024];
            let read = self
                .stream
                .read(&mut chunk)
                .await
                .map_err(|e| e.to_string())?;
            if read == 0 {
                return Err("Redis closed the connection".into());
            }
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    /// Sends one command and reads its reply: 200 for a success, 500 for an error reply.
    pub async fn exchange(&mut self, command: &[u8]) -> Result<u16, String> {
        self.send(command).await?;
        Ok(match self.read().await? {
            Resp::Error(_) => 500,
            _ => 200,
        })
    }

    /// Sends commands and reads one reply each; any error reply fails.
    pub async fn pipeline(&mut self, commands: &[u8], replies: usize) -> Result<(), String> {
        self.send(commands).await?;
        for _ in 0..replies {
            if let Resp::Error(error) = self.read().await? {
                return Err(format!("Redis: {error}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_round_trip_and_partial_input() {
        let mut out = Vec::new();
        command(&mut out, &[b"SET", b"k", b"v"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
        let (value, used) = parse(&out).unwrap().unwrap();
        assert_eq!(used, out.len());
        assert_eq!(
            value,
            Resp::Array(vec![
                Resp::Bulk(Some(b"SET".to_vec())),
                Resp::Bulk(Some(b"k".to_vec())),
                Resp::Bulk(Some(b"v".to_vec()))
            ])
        );
        assert_eq!(parse(&out[..out.len() - 1]).unwrap(), None);
        assert_eq!(
            parse(b"+OK\r\n:5\r\n").unwrap(),
            Some((Resp::Simple("OK".into()), 5))
        );
        assert_eq!(parse(b":-2\r\n").unwrap(), Some((Resp::Integer(-2), 5)));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Some((Resp::Bulk(None), 5)));
        assert!(matches!(
            parse(b"-ERR x\r\n").unwrap(),
            Some((Resp::Error(_), 8))
        ));
        assert!(parse(b"?\r\n").is_err());
    }
}
