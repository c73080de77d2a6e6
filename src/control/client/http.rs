//! The HTTP side of `volfsd ctl`: one request per connection to the control socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A reply from the daemon.
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// One request over the control socket (one connection, `Connection: close`).
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Response, String> {
    let mut s = UnixStream::connect(socket)
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let body = body.unwrap_or("");
    let mut msg = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        msg.push_str("Content-Type: application/json\r\n");
    }
    msg.push_str("\r\n");
    msg.push_str(body);
    s.write_all(msg.as_bytes())
        .map_err(|e| format!("sending {method} {path}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("reading the reply to {method} {path}: {e}"))?;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(format!("malformed reply to {method} {path}")),
    };
    Ok(Response {
        status: resp.code.unwrap_or(0),
        body: String::from_utf8_lossy(&raw[head..]).into_owned(),
    })
}

pub(super) fn error_text(r: &Response) -> String {
    serde_json::from_str::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| r.body.clone())
}

pub(super) fn expect(r: Response, ok: &[u16], what: &str) -> Result<Response, String> {
    if ok.contains(&r.status) {
        Ok(r)
    } else {
        Err(format!("{what}: HTTP {}: {}", r.status, error_text(&r)))
    }
}
