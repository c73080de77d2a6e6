//! Minimal HTTP/1.1 framing for the control socket: httparse parses the head; this
//! file bounds what a client may send (head size, body size, time) and writes replies.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// Largest request body accepted (413 beyond).
pub const MAX_BODY: usize = 64 * 1024;
/// Largest request head (request line + headers) accepted (431 beyond).
pub const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 32;

#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    /// The client asked to close after this request (or spoke HTTP/1.0).
    pub close: bool,
}

#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection before a request started.
    Closed,
    /// A status to answer with, then close.
    Reply(u16, String),
    Io(io::Error),
}

/// A stream whose reads can be bounded by a deadline for the whole request.
pub trait TimedRead: Read {
    /// Bounds the next reads to `timeout` (None: no bound).
    fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()>;
}

impl TimedRead for std::os::unix::net::UnixStream {
    fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
}

impl TimedRead for &[u8] {
    fn set_timeout(&mut self, _timeout: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

/// Reads with the remaining time to `deadline` as the read timeout, so a client that
/// trickles bytes cannot extend its request indefinitely.
fn read_until(
    stream: &mut impl TimedRead,
    chunk: &mut [u8],
    deadline: Option<Instant>,
) -> Result<usize, ReadError> {
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Reply(
                408,
                "request not completed in time".into(),
            ));
        }
        stream.set_timeout(Some(left)).map_err(ReadError::Io)?;
    }
    stream.read(chunk).map_err(timeout_to_reply)
}

/// Reads one request, which must arrive whole within `limit` of its first byte.
/// `buf` carries bytes already read past the previous request.
pub fn read_request(
    stream: &mut impl TimedRead,
    buf: &mut Vec<u8>,
    limit: Option<Duration>,
) -> Result<Request, ReadError> {
    let mut chunk = [0u8; 4096];
    // The clock starts at the first byte: an idle keep-alive connection waits for
    // its next request under the caller's idle timeout instead.
    let mut deadline = if buf.is_empty() {
        None
    } else {
        limit.map(|l| Instant::now() + l)
    };
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                if head_len > MAX_HEAD {
                    return Err(ReadError::Reply(431, "request head too large".into()));
                }
                let method = req.method.unwrap_or("").to_string();
                let path = req.path.unwrap_or("").to_string();
                let close_hdr = header(&req, "connection")
                    .map(|v| v.eq_ignore_ascii_case(b"close"))
                    .unwrap_or(false);
                let close = close_hdr || req.version == Some(0);
                if header(&req, "transfer-encoding").is_some() {
                    return Err(ReadError::Reply(
                        411,
                        "chunked bodies are not accepted; send Content-Length".into(),
                    ));
                }
                let len = match header(&req, "content-length") {
                    None => 0,
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.trim().parse::<usize>().ok())
                        .ok_or_else(|| ReadError::Reply(400, "bad Content-Length".into()))?,
                };
                if len > MAX_BODY {
                    return Err(ReadError::Reply(
                        413,
                        format!("body of {len} bytes is over the {MAX_BODY}-byte limit"),
                    ));
                }
                buf.drain(..head_len);
                while buf.len() < len {
                    let n = read_until(stream, &mut chunk, deadline)?;
                    if n == 0 {
                        return Err(ReadError::Reply(
                            400,
                            "body shorter than Content-Length".into(),
                        ));
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body: Vec<u8> = buf.drain(..len).collect();
                return Ok(Request {
                    method,
                    path,
                    body,
                    close,
                });
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD {
                    return Err(ReadError::Reply(431, "request head too large".into()));
                }
                let n = read_until(stream, &mut chunk, deadline)?;
                if deadline.is_none() {
                    deadline = limit.map(|l| Instant::now() + l);
                }
                if n == 0 {
                    return Err(if buf.is_empty() {
                        ReadError::Closed
                    } else {
                        ReadError::Reply(400, "connection closed mid-request".into())
                    });
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) => return Err(ReadError::Reply(400, format!("malformed request: {e}"))),
        }
    }
}

fn header<'a>(req: &httparse::Request<'_, 'a>, name: &str) -> Option<&'a [u8]> {
    req.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

fn timeout_to_reply(e: io::Error) -> ReadError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            ReadError::Reply(408, "request not completed in time".into())
        }
        _ => ReadError::Io(e),
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Writes a response with a JSON body (none for 204).
/// The content type of every reply but `GET /metrics`'s.
pub const JSON: &str = "application/json";

pub fn write_response(
    stream: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &str,
    close: bool,
) -> io::Result<()> {
    let body = if status == 204 { "" } else { body };
    let mut msg = format!(
        "HTTP/1.1 {status} {}\r\nServer: volfsd\r\nContent-Length: {}\r\n",
        reason(status),
        body.len()
    );
    if !body.is_empty() {
        msg.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if close {
        msg.push_str("Connection: close\r\n");
    }
    msg.push_str("\r\n");
    msg.push_str(body);
    stream.write_all(msg.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(raw: &[u8]) -> Result<Request, ReadError> {
        let mut buf = Vec::new();
        read_request(&mut &raw[..], &mut buf, Some(Duration::from_secs(5)))
    }

    #[test]
    fn parses_put_with_body() {
        let r = read(b"PUT /volumes/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("PUT", "/volumes/a"));
        assert_eq!(r.body, b"{}");
        assert!(!r.close);
    }

    #[test]
    fn rejects_big_bodies_and_bad_lengths() {
        let big = format!(
            "PUT /v HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert!(matches!(
            read(big.as_bytes()),
            Err(ReadError::Reply(413, _))
        ));
        let bad = b"PUT /v HTTP/1.1\r\nContent-Length: x\r\n\r\n";
        assert!(matches!(read(bad), Err(ReadError::Reply(400, _))));
        assert!(matches!(
            read(b"\x01\x02 garbage\r\n\r\n"),
            Err(ReadError::Reply(400, _))
        ));
        assert!(matches!(read(b""), Err(ReadError::Closed)));
        let pad = "a".repeat(MAX_HEAD + 1);
        let head = format!("GET /health HTTP/1.1\r\nX-Pad: {pad}\r\n\r\n");
        assert!(matches!(
            read(head.as_bytes()),
            Err(ReadError::Reply(431, _))
        ));
        assert!(matches!(
            read(b"GET /health HTTP/1.1\r\nHost"),
            Err(ReadError::Reply(400, _))
        ));
    }

    #[test]
    fn response_has_length_and_json_type() {
        let mut out = Vec::new();
        write_response(&mut out, 201, JSON, "{\"a\":1}", true).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("HTTP/1.1 201 Created\r\n"));
        assert!(s.contains("Content-Length: 7\r\n"));
        assert!(s.contains("Connection: close\r\n"));
        assert!(s.ends_with("\r\n\r\n{\"a\":1}"));
    }
}
