//! `volfsd ctl attach --bind` and `detach`: the bind mount a node agent would make
//! (nodev,nosuid, read-only when asked), made and undone around the API calls, with
//! every step rolled back if a later one fails.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount, MsFlags};

use super::error::{decode, CtlError};
use super::http::{expect, request};
use crate::control::api::{Health, VolumeInfo};
use crate::qos::RateLimit;
use crate::sandbox::mounts::unescape;

/// What `ctl attach` asks for.
pub(super) struct AttachOptions {
    pub path: Option<PathBuf>,
    pub read_only: bool,
    pub volume_id: Option<String>,
    pub bind: Option<PathBuf>,
    pub limit: Option<RateLimit>,
}

pub(super) fn attach(
    socket: &Path,
    json: bool,
    name: &str,
    options: AttachOptions,
) -> Result<String, CtlError> {
    let AttachOptions {
        path,
        read_only,
        volume_id,
        bind,
        limit,
    } = options;
    let target = match path {
        Some(p) => p,
        None => {
            let h = expect(request(socket, "GET", "/health", None)?, &[200], "health")?;
            let h: Health = decode(&h.body, "GET /health")?;
            Path::new(&h.shared_dir).join(name)
        }
    };
    let mut undo = Rollback::default();
    if let Some(host) = &bind {
        // A retry must not stack a second bind mount: if the volume is attached
        // already, compare instead of binding again.
        let existing = request(socket, "GET", &format!("/volumes/{name}"), None)?;
        if existing.status == 200 {
            let v: VolumeInfo = decode(&existing.body, &format!("GET /volumes/{name}"))?;
            let same_dir = Path::new(&v.path) == target
                || Path::new(&v.path).canonicalize().ok() == target.canonicalize().ok();
            if same_dir
                && v.read_only == read_only
                && v.volume_id == volume_id
                && v.rate_limiter == limit
            {
                return Ok(if json {
                    existing.body
                } else {
                    format!("already attached {name} from {}", v.path)
                });
            }
            return Err(CtlError::Refused {
                op: format!("attach {name}"),
                status: 409,
                error: format!(
                    "already attached with other parameters (path {}, {})",
                    v.path,
                    if v.read_only { "ro" } else { "rw" }
                ),
            });
        }
        if is_mount_point(&target) {
            return Err(CtlError::Conflict {
                volume: name.to_string(),
                why: format!(
                    "{} is already a mount point; detach or unmount it first",
                    target.display()
                ),
            });
        }
        undo.bind(host, &target, read_only)
            .map_err(|(step, path, source)| CtlError::Host {
                volume: format!("attach {name}"),
                step,
                path,
                source,
            })?;
    }
    // With --bind, the daemon checks that it sees the bind mount just made (it does
    // not when SharedDir is not a shared mount), rather than the empty directory
    // under it.
    let expected_root = match &bind {
        Some(_) => {
            use std::os::unix::fs::MetadataExt;
            match std::fs::metadata(&target) {
                Ok(m) => Some(serde_json::json!({ "dev": m.dev(), "ino": m.ino() })),
                Err(source) => {
                    undo.run();
                    return Err(CtlError::Host {
                        volume: format!("attach {name}"),
                        step: "stat".into(),
                        path: target.clone(),
                        source,
                    });
                }
            }
        }
        None => None,
    };
    let mut body = serde_json::json!({
        "path": target.display().to_string(),
        "read_only": read_only,
        "volume_id": volume_id,
    });
    if let Some(l) = limit {
        body["rate_limiter"] = serde_json::json!(l);
    }
    if let Some(e) = expected_root {
        body["expect"] = e;
    }
    let body = body.to_string();
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

pub(super) fn detach(socket: &Path, name: &str) -> Result<String, CtlError> {
    let r = expect(
        request(socket, "GET", &format!("/volumes/{name}"), None)?,
        &[200],
        &format!("detach {name}"),
    )?;
    let v: VolumeInfo = decode(&r.body, &format!("GET /volumes/{name}"))?;
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
        return Err(CtlError::Host {
            volume: format!("detach {name} (volume re-attached)"),
            step: "umount".into(),
            path,
            source: e.into(),
        });
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
    /// The failed step, its path and the system's answer on an error.
    fn bind(
        &mut self,
        host: &Path,
        target: &Path,
        read_only: bool,
    ) -> Result<(), (String, PathBuf, std::io::Error)> {
        if !target.exists() {
            std::fs::create_dir(target)
                .map_err(|e| ("creating mount point".to_string(), target.to_path_buf(), e))?;
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
            return Err((
                format!("bind-mounting {} at", host.display()),
                target.to_path_buf(),
                e.into(),
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
            return Err((
                format!(
                    "remounting nodev,nosuid{}",
                    if read_only { ",ro" } else { "" }
                ),
                target.to_path_buf(),
                e.into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
