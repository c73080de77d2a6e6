//! What `volfsd ctl` failed at, with the request, volume or path it concerned.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::qos::QosError;

/// An error of `volfsd ctl`.
#[derive(Debug)]
pub enum CtlError {
    /// The command line asks for something that cannot be sent.
    Usage(String),
    /// The command line's rate-limit options are no valid limit.
    Limit(QosError),
    /// The control socket could not be reached, written or read (`op`: what was
    /// being done, the request included).
    Socket { op: String, source: io::Error },
    /// The daemon's reply to `request` is not what the API says.
    BadReply { request: String, why: String },
    /// The daemon refused `op` with an HTTP status and its error text.
    Refused {
        op: String,
        status: u16,
        error: String,
    },
    /// A step of `attach --bind` or of `detach` on the host failed for `volume`.
    Host {
        volume: String,
        step: String,
        path: PathBuf,
        source: io::Error,
    },
    /// `attach --bind` found the volume attached with other parameters, or its
    /// mount point taken.
    Conflict { volume: String, why: String },
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtlError::Usage(why) => write!(f, "{why}"),
            CtlError::Limit(e) => write!(f, "{e}"),
            CtlError::Socket { op, source } => write!(f, "{op}: {source}"),
            CtlError::BadReply { request, why } => write!(f, "bad reply to {request}: {why}"),
            CtlError::Refused { op, status, error } => write!(f, "{op}: HTTP {status}: {error}"),
            CtlError::Host {
                volume,
                step,
                path,
                source,
            } => write!(f, "{volume}: {step} {}: {source}", path.display()),
            CtlError::Conflict { volume, why } => write!(f, "attach {volume}: {why}"),
        }
    }
}

impl std::error::Error for CtlError {}

impl From<QosError> for CtlError {
    fn from(e: QosError) -> Self {
        CtlError::Limit(e)
    }
}

impl From<String> for CtlError {
    fn from(why: String) -> Self {
        CtlError::Usage(why)
    }
}

impl From<&str> for CtlError {
    fn from(why: &str) -> Self {
        CtlError::Usage(why.to_string())
    }
}

/// A reply body that does not decode as `T`.
pub(super) fn decode<T: serde::de::DeserializeOwned>(
    body: &str,
    request: &str,
) -> Result<T, CtlError> {
    serde_json::from_str(body).map_err(|e| CtlError::BadReply {
        request: request.to_string(),
        why: e.to_string(),
    })
}
