//! `volfsd ctl`: a client for the control socket, for operators and for standalone use
//! without a node agent (`attach --bind` makes the bind mount the agent would make).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use nix::mount::{mount, umount, MsFlags};

use super::api::{Health, VolumeInfo};

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
    },
    /// Remove NAME from the guest, then unmount its bind mount if it has one.
    Detach { name: String },
    /// List attached volumes.
    List,
    /// Show one volume's counters, or all volumes' and the device's health.
    Stats { name: Option<String> },
}

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

fn error_text(r: &Response) -> String {
    serde_json::from_str::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| r.body.clone())
}

fn expect(r: Response, ok: &[u16], what: &str) -> Result<Response, String> {
    if ok.contains(&r.status) {
        Ok(r)
    } else {
        Err(format!("{what}: HTTP {}: {}", r.status, error_text(&r)))
    }
}

/// Runs `volfsd ctl ...`; returns the text to print.
pub fn run(args: CtlArgs) -> Result<String, String> {
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
        } => attach(&socket, args.json, &name, path, read_only, volume_id, bind),
        CtlCommand::Detach { name } => detach(&socket, &name),
        CtlCommand::List => {
            let r = expect(request(&socket, "GET", "/volumes", None)?, &[200], "list")?;
            if args.json {
                return Ok(r.body);
            }
            let vols: Vec<VolumeInfo> =
                serde_json::from_str(&r.body).map_err(|e| format!("bad reply: {e}"))?;
            Ok(table(&vols))
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
                    let v: VolumeInfo =
                        serde_json::from_str(&r.body).map_err(|e| format!("bad reply: {e}"))?;
                    Ok(details(&v))
                }
                None => {
                    let h = expect(request(&socket, "GET", "/health", None)?, &[200], "health")?;
                    let h: Health =
                        serde_json::from_str(&h.body).map_err(|e| format!("bad reply: {e}"))?;
                    let vols: Vec<VolumeInfo> =
                        serde_json::from_str(&r.body).map_err(|e| format!("bad reply: {e}"))?;
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

fn attach(
    socket: &Path,
    json: bool,
    name: &str,
    path: Option<PathBuf>,
    read_only: bool,
    volume_id: Option<String>,
    bind: Option<PathBuf>,
) -> Result<String, String> {
    let target = match path {
        Some(p) => p,
        None => {
            let h = expect(request(socket, "GET", "/health", None)?, &[200], "health")?;
            let h: Health = serde_json::from_str(&h.body).map_err(|e| format!("bad reply: {e}"))?;
            Path::new(&h.shared_dir).join(name)
        }
    };
    let mut undo = Rollback::default();
    if let Some(host) = &bind {
        // A retry must not stack a second bind mount: if the volume is attached
        // already, compare instead of binding again.
        let existing = request(socket, "GET", &format!("/volumes/{name}"), None)?;
        if existing.status == 200 {
            let v: VolumeInfo =
                serde_json::from_str(&existing.body).map_err(|e| format!("bad reply: {e}"))?;
            let same_dir = Path::new(&v.path) == target
                || Path::new(&v.path).canonicalize().ok() == target.canonicalize().ok();
            if same_dir && v.read_only == read_only && v.volume_id == volume_id {
                return Ok(if json {
                    existing.body
                } else {
                    format!("already attached {name} from {}", v.path)
                });
            }
            return Err(format!(
                "attach {name}: HTTP 409: already attached with other parameters (path {}, {})",
                v.path,
                if v.read_only { "ro" } else { "rw" }
            ));
        }
        if is_mount_point(&target) {
            return Err(format!(
                "attach {name}: {} is already a mount point; detach or unmount it first",
                target.display()
            ));
        }
        undo.bind(host, &target, read_only)?;
    }
    let body = serde_json::json!({
        "path": target.display().to_string(),
        "read_only": read_only,
        "volume_id": volume_id,
    })
    .to_string();
    let r = request(socket, "PUT", &format!("/volumes/{name}"), Some(&body))
        .and_then(|r| expect(r, &[200, 201], &format!("attach {name}")));
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            undo.run();
            return Err(e);
        }
    };
    undo.forget();
    if json {
        return Ok(r.body);
    }
    let verb = if r.status == 201 {
        "attached"
    } else {
        "already attached"
    };
    Ok(format!(
        "{verb} {name} ({}) from {}",
        if read_only { "ro" } else { "rw" },
        target.display()
    ))
}

fn detach(socket: &Path, name: &str) -> Result<String, String> {
    let r = expect(
        request(socket, "GET", &format!("/volumes/{name}"), None)?,
        &[200],
        &format!("detach {name}"),
    )?;
    let v: VolumeInfo = serde_json::from_str(&r.body).map_err(|e| format!("bad reply: {e}"))?;
    expect(
        request(socket, "DELETE", &format!("/volumes/{name}"), None)?,
        &[204],
        &format!("detach {name}"),
    )?;
    let path = PathBuf::from(&v.path);
    if !is_mount_point(&path) {
        return Ok(format!("detached {name}"));
    }
    if let Err(e) = umount(&path) {
        // Roll back: the guest gets the volume again rather than losing it silently.
        let body = serde_json::json!({
            "path": v.path, "read_only": v.read_only, "volume_id": v.volume_id,
        })
        .to_string();
        let _ = request(socket, "PUT", &format!("/volumes/{name}"), Some(&body));
        return Err(format!(
            "detach {name}: umount {}: {e} (volume re-attached)",
            path.display()
        ));
    }
    let _ = std::fs::remove_dir(&path);
    Ok(format!("detached {name} and unmounted {}", path.display()))
}

/// Steps of `attach --bind` to undo if a later step fails.
#[derive(Default)]
struct Rollback {
    mounted: Option<PathBuf>,
    created_dir: Option<PathBuf>,
}

impl Rollback {
    fn bind(&mut self, host: &Path, target: &Path, read_only: bool) -> Result<(), String> {
        if !target.exists() {
            std::fs::create_dir(target)
                .map_err(|e| format!("creating mount point {}: {e}", target.display()))?;
            self.created_dir = Some(target.to_path_buf());
        }
        let r = mount(
            Some(host),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        );
        if let Err(e) = r {
            self.run();
            return Err(format!(
                "bind-mounting {} at {}: {e}",
                host.display(),
                target.display()
            ));
        }
        self.mounted = Some(target.to_path_buf());
        // nodev and nosuid always: a device node or setuid file a guest plants in its
        // volume stays inert on the host, whatever opens it.
        let mut flags =
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NODEV | MsFlags::MS_NOSUID;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        if let Err(e) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
            self.run();
            return Err(format!(
                "remounting {} nodev,nosuid{}: {e}",
                target.display(),
                if read_only { ",ro" } else { "" }
            ));
        }
        Ok(())
    }

    fn run(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = umount(&m);
        }
        if let Some(d) = self.created_dir.take() {
            let _ = std::fs::remove_dir(d);
        }
    }

    fn forget(&mut self) {
        self.mounted = None;
        self.created_dir = None;
    }
}

fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(parent)) = (std::fs::metadata(path), path.parent()) else {
        return false;
    };
    let Ok(up) = std::fs::metadata(parent) else {
        return false;
    };
    if me.dev() != up.dev() || me.ino() == up.ino() {
        return true;
    }
    // A bind mount of a directory of the same file system keeps st_dev: ask mountinfo.
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines().any(|l| {
                l.split(' ')
                    .nth(4)
                    .map(|p| Path::new(&unescape(p)) == canon)
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
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
         bytes_read:    {}\nbytes_written: {}\nerrors:        {}",
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
        v.stats.errors
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
