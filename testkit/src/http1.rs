//! The server side of HTTP/1.1, just enough for a test double: request heads, bodies framed by
//! `Content-Length` or chunked transfer coding, keep-alive, and responses with a fixed length
//! or chunked. Hand-written (rather than hyper) so the mock controls every byte and can reset
//! or stall a connection at an exact offset.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body accepted (tests send far less; this only bounds a runaway client).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target as sent (path and query).
    pub path: String,
    /// Header names lower-cased, values as sent, in order.
    pub headers: Vec<(String, String)>,
    /// The body after transfer decoding.
    pub body: Bytes,
    /// Whether the client allows the connection to be reused.
    pub keep_alive: bool,
}

/// A server-side connection with its read buffer.
pub(crate) struct Conn {
    pub stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Self {
        Conn {
            stream,
            buf: BytesMut::with_capacity(8 * 1024),
        }
    }

    /// Reads the next request; `Ok(None)` when the client closed the connection cleanly
    /// between requests.
    pub async fn read_request(&mut self) -> std::io::Result<Option<Request>> {
        let head_end = loop {
            if let Some(pos) = find(&self.buf, b"\r\n\r\n") {
                break pos;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("request head too large"));
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        };
        let head = self.buf.split_to(head_end + 4);
        let head = std::str::from_utf8(&head).map_err(|_| invalid("request head is not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let version = parts.next().unwrap_or_default();
        if method.is_empty() || path.is_empty() || !version.starts_with("HTTP/1.") {
            return Err(invalid("bad request line"));
        }
        let mut headers = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| invalid("bad header line"))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let connection = header("connection")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let keep_alive = if version == "HTTP/1.0" {
            connection.contains("keep-alive")
        } else {
            !connection.contains("close")
        };
        if header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
            self.stream
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await?;
        }
        let chunked =
            header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let body = if chunked {
            self.read_chunked().await?
        } else {
            let len = match header("content-length") {
                Some(v) => v
                    .parse::<usize>()
                    .map_err(|_| invalid("bad content-length"))?,
                None => 0,
            };
            if len > MAX_BODY {
                return Err(invalid("request body too large"));
            }
            self.read_exact_body(len).await?
        };
        Ok(Some(Request {
            method,
            path,
            headers,
            body,
            keep_alive,
        }))
    }

    async fn fill(&mut self, want: usize) -> std::io::Result<()> {
        while self.buf.len() < want {
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    async fn read_exact_body(&mut self, len: usize) -> std::io::Result<Bytes> {
        self.fill(len).await?;
        Ok(self.buf.split_to(len).freeze())
    }

    async fn read_line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(pos) = find(&self.buf, b"\r\n") {
                let line = self.buf.split_to(pos + 2);
                return Ok(String::from_utf8_lossy(&line[..pos]).into_owned());
            }
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("chunk line too long"));
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    async fn read_chunked(&mut self) -> std::io::Result<Bytes> {
        let mut body = BytesMut::new();
        loop {
            let line = self.read_line().await?;
            let size_hex = line.split(';').next().unwrap_or_default().trim();
            let size =
                usize::from_str_radix(size_hex, 16).map_err(|_| invalid("bad chunk size"))?;
            if size == 0 {
                // trailers, up to the blank line
                while !self.read_line().await?.is_empty() {}
                return Ok(body.freeze());
            }
            if body.len() + size > MAX_BODY {
                return Err(invalid("request body too large"));
            }
            self.fill(size + 2).await?;
            body.extend_from_slice(&self.buf[..size]);
            self.buf.advance(size + 2);
        }
    }
}

/// The response head for `status` with these extra headers; `length` `Some` gives a
/// `Content-Length`, `None` chunked transfer coding.
pub(crate) fn response_head(
    status: u16,
    headers: &[(&str, String)],
    length: Option<usize>,
    keep_alive: bool,
) -> String {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    match length {
        Some(len) => head.push_str(&format!("content-length: {len}\r\n")),
        None => head.push_str("transfer-encoding: chunked\r\n"),
    }
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    head
}

/// One chunk of a chunked body (`data` must not be empty: an empty chunk ends the body).
pub(crate) fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The chunk that ends a chunked body.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn invalid(msg: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tokio::io::AsyncWriteExt;

    use super::Conn;

    /// Writes `wire` to a fresh loopback connection in `pieces`-sized writes and parses
    /// every request the server side reads from it.
    fn parse_all(wire: Vec<u8>, piece: usize) -> Vec<(String, Vec<u8>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("bind: {e}"));
            let addr = listener
                .local_addr()
                .unwrap_or_else(|e| panic!("addr: {e}"));
            let writer = tokio::spawn(async move {
                let mut client = tokio::net::TcpStream::connect(addr)
                    .await
                    .unwrap_or_else(|e| panic!("connect: {e}"));
                let _ = client.set_nodelay(true);
                for part in wire.chunks(piece.max(1)) {
                    client
                        .write_all(part)
                        .await
                        .unwrap_or_else(|e| panic!("write: {e}"));
                }
            });
            let (server, _) = listener
                .accept()
                .await
                .unwrap_or_else(|e| panic!("accept: {e}"));
            let mut conn = Conn::new(server);
            let mut got = Vec::new();
            while let Ok(Some(req)) = conn.read_request().await {
                got.push((req.path, req.body.to_vec()));
            }
            let _ = writer.await;
            got
        })
    }

    fn chunked(body: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for c in body.chunks(size.max(1)) {
            out.extend_from_slice(format!("{:X};ext=1\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Keep-alive requests with bodies framed by Content-Length or chunked coding, written
        /// in arbitrary pieces, parse back to the same paths and bodies, in order.
        #[test]
        fn bodies_survive_any_framing_and_any_write_split(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..4),
            chunk_size in 1usize..64,
            piece in 1usize..50,
            use_chunked in any::<bool>(),
        ) {
            let mut wire = Vec::new();
            for (i, body) in bodies.iter().enumerate() {
                if use_chunked {
                    wire.extend_from_slice(format!("POST /r{i} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes());
                    wire.extend_from_slice(&chunked(body, chunk_size));
                } else {
                    wire.extend_from_slice(format!("POST /r{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
                    wire.extend_from_slice(body);
                }
            }
            let got = parse_all(wire, piece);
            let want: Vec<(String, Vec<u8>)> = bodies.iter().enumerate().map(|(i, b)| (format!("/r{i}"), b.clone())).collect();
            prop_assert_eq!(got, want);
        }
    }
}
