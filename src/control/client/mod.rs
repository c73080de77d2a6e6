//! `volfsd ctl`: a client for the control socket, for operators and for standalone use
//! without a node agent (`attach --bind` makes the bind mount the agent would make).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::api::{Health, VolumeInfo};
use crate::qos::{QosError, RateLimit};

#[derive(Debug, Parser)]
#[command(
    name = "volfsd ctl",
    about = "Attach, detach and inspect volumes of a running volfsd"
)]
pub struct CtlArgs {
    /// The daemon's control socket.
    #[arg(long, global = true, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,

    /// Print the daemon's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Expose a directory of SharedDir to the guest as NAME.
    Attach {
        name: String,
        /// The directory inside SharedDir (default: SharedDir/NAME).
        #[arg(long)]
        path: Option<PathBuf>,
        /// Serve it read-only.
        #[arg(long)]
        read_only: bool,
        /// The platform's volume id, for logs and stats.
        #[arg(long)]
        volume_id: Option<String>,
        /// First bind-mount HOST_PATH at SharedDir/NAME (read-only with --read-only),
        /// as a node agent would; rolled back if the attach fails.
        #[arg(long, value_name = "HOST_PATH")]
        bind: Option<PathBuf>,
        /// A rate limit, as in --allowed-dir: ops_size=N, ops_refill_time_ms=MS,
        /// bw_size=BYTES, ... Repeatable.
        #[arg(long = "limit", value_name = "KEY=N")]
        limits: Vec<String>,
    },
    /// Remove NAME from the guest, then unmount its bind mount if it has one.
    Detach { name: String },
    /// Set, change or lift NAME's rate limits while the guest runs (PATCH).
    Limit {
        name: String,
        /// The new limits (they replace the old ones whole): ops_size=N,
        /// ops_one_time_burst=N, ops_refill_time_ms=MS, bw_size=BYTES,
        /// bw_one_time_burst=BYTES, bw_refill_time_ms=MS.
        #[arg(value_name = "KEY=N", required_unless_present = "none")]
        options: Vec<String>,
        /// Lift every limit.
        #[arg(long, conflicts_with = "options")]
        none: bool,
    },
    /// List attached volumes.
    List,
    /// Show one volume's counters, or all volumes' and the device's health.
    Stats { name: Option<String> },
    /// Print the Prometheus metrics (GET /metrics).
    Metrics,
    /// Replace the serving process under the running VM by a new one of the binary
    /// as it is on disk now (needs --upgradable); if it fails, the old one serves on
    /// and this says why.
    Upgrade {
        /// Run this binary instead (an absolute path; a regular executable file
        /// owned by root or the daemon's user and writable by no one else, in a
        /// directory alike). Only root and the daemon's own user may name one. The
        /// daemon goes on from it: a later upgrade or crash restart runs it too.
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
    },
}

mod bind;
mod error;
mod http;

use bind::{attach, detach};
use error::decode;
pub use error::CtlError;
use http::expect;
pub use http::request;

/// Runs `volfsd ctl ...`; returns the text to print.
pub fn run(args: CtlArgs) -> Result<String, CtlError> {
    let socket = args
        .control_socket
        .clone()
        .ok_or("--control-socket is required")?;
    match args.command {
        CtlCommand::Attach {
            name,
            path,
            read_only,
            volume_id,
            bind,
            limits,
        } => {
            let limit = parse_limit(&limits)?;
            attach(
                &socket,
                args.json,
                &name,
                bind::AttachOptions {
                    path,
                    read_only,
                    volume_id,
                    bind,
                    limit,
                },
            )
        }
        CtlCommand::Limit {
            name,
            options,
            none,
        } => {
            let limit = if none { None } else { parse_limit(&options)? };
            let body = serde_json::json!({ "rate_limiter": limit }).to_string();
            let r = expect(
                request(&socket, "PATCH", &format!("/volumes/{name}"), Some(&body))?,
                &[200],
                &format!("limit {name}"),
            )?;
            if args.json {
                return Ok(r.body);
            }
            Ok(format!(
                "{name}: {}",
                limit
                    .map(|l| format!("limited to {}", crate::qos::describe(&l)))
                    .unwrap_or_else(|| "unlimited".into())
            ))
        }
        CtlCommand::Detach { name } => detach(&socket, &name),
        CtlCommand::List => {
            let r = expect(request(&socket, "GET", "/volumes", None)?, &[200], "list")?;
            if args.json {
                return Ok(r.body);
            }
            let vols: Vec<VolumeInfo> = decode(&r.body, "GET /volumes")?;
            Ok(table(&vols))
        }
        CtlCommand::Upgrade { binary } => {
            let body = binary
                .as_ref()
                .map(|b| serde_json::json!({ "binary": b }).to_string());
            let r = expect(
                request(&socket, "PUT", "/upgrade", body.as_deref())?,
                &[200],
                "upgrade",
            )?;
            if args.json {
                return Ok(r.body);
            }
            let v: serde_json::Value = decode(&r.body, "PUT /upgrade")?;
            Ok(format!("upgraded: the guest waited {} ms", v["pause_ms"]))
        }
        CtlCommand::Metrics => {
            let r = expect(
                request(&socket, "GET", "/metrics", None)?,
                &[200],
                "metrics",
            )?;
            Ok(r.body.trim_end().to_string())
        }
        CtlCommand::Stats { name } => {
            let path = match &name {
                Some(n) => format!("/volumes/{n}"),
                None => "/volumes".to_string(),
            };
            let r = expect(request(&socket, "GET", &path, None)?, &[200], "stats")?;
            if args.json {
                return Ok(r.body);
            }
            match name {
                Some(_) => {
                    let v: VolumeInfo = decode(&r.body, &format!("GET {path}"))?;
                    Ok(details(&v))
                }
                None => {
                    let h = expect(request(&socket, "GET", "/health", None)?, &[200], "health")?;
                    let h: Health = decode(&h.body, "GET /health")?;
                    let vols: Vec<VolumeInfo> = decode(&r.body, "GET /volumes")?;
                    let mut out = format!(
                        "frontend connected: {}\nactive queues: {} of {} request queues + hiprio\n\n",
                        h.frontend_connected, h.active_queues, h.request_queues
                    );
                    out.push_str(&table(&vols));
                    Ok(out)
                }
            }
        }
    }
}

/// `KEY=N` options as one limit (None for no options).
fn parse_limit(options: &[String]) -> Result<Option<RateLimit>, QosError> {
    if options.is_empty() {
        return Ok(None);
    }
    let mut limit = RateLimit::default();
    for o in options {
        limit.set_option(o)?;
    }
    limit.check()?;
    Ok(Some(limit))
}

fn table(vols: &[VolumeInfo]) -> String {
    if vols.is_empty() {
        return "no volumes attached".to_string();
    }
    let mut out = format!(
        "{:<20} {:<3} {:>7} {:>7} {:>10} {:>12} {:>12} {:>7}  {}\n",
        "NAME", "RO", "HANDLES", "INODES", "OPS", "READ", "WRITTEN", "ERRORS", "PATH"
    );
    for v in vols {
        out.push_str(&format!(
            "{:<20} {:<3} {:>7} {:>7} {:>10} {:>12} {:>12} {:>7}  {}\n",
            v.name,
            if v.read_only { "ro" } else { "rw" },
            v.open_handles,
            v.live_inodes,
            v.stats.ops,
            v.stats.bytes_read,
            v.stats.bytes_written,
            v.stats.errors,
            v.path
        ));
    }
    out.trim_end().to_string()
}

fn details(v: &VolumeInfo) -> String {
    format!(
        "name:          {}\nvolume_id:     {}\npath:          {}\nread_only:     {}\n\
         attached_at:   {}\nopen_handles:  {}\nlive_inodes:   {}\nops:           {}\n\
         bytes_read:    {}\nbytes_written: {}\nerrors:        {}\nrate_limit:    {}\n\
         throttled:     {} requests, {:.3} s waited, {} waiting now",
        v.name,
        v.volume_id.as_deref().unwrap_or("-"),
        v.path,
        v.read_only,
        v.attached_at,
        v.open_handles,
        v.live_inodes,
        v.stats.ops,
        v.stats.bytes_read,
        v.stats.bytes_written,
        v.stats.errors,
        v.rate_limiter
            .as_ref()
            .map(crate::qos::describe)
            .unwrap_or_else(|| "none".into()),
        v.qos.throttled_requests,
        v.qos.wait_seconds,
        v.qos.waiting_requests
    )
}
