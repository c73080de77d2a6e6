//! The HTTP side of `volfsd ctl`: one request per connection to the control socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::error::CtlError;

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
) -> Result<Response, CtlError> {
    let mut s = UnixStream::connect(socket).map_err(|source| CtlError::Socket {
        op: format!("connecting to {}", socket.display()),
        source,
    })?;
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
        .map_err(|source| CtlError::Socket {
            op: format!("sending {method} {path}"),
            source,
        })?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|source| CtlError::Socket {
        op: format!("reading the reply to {method} {path}"),
        source,
    })?;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => {
            return Err(CtlError::BadReply {
                request: format!("{method} {path}"),
                why: "not an HTTP response".into(),
            })
        }
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

pub(super) fn expect(r: Response, ok: &[u16], what: &str) -> Result<Response, CtlError> {
    if ok.contains(&r.status) {
        Ok(r)
    } else {
        Err(CtlError::Refused {
            op: what.to_string(),
            status: r.status,
            error: error_text(&r),
        })
    }
}
