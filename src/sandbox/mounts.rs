//! The daemon's view of the file system: SharedDir becomes its root.
//!
//! namespace mode, in the daemon's own mount namespace:
//! 1. every mount becomes a slave (`MS_SLAVE | MS_REC`): mounts the node agent adds
//!    under a shared SharedDir on the host still propagate in, nothing propagates out;
//! 2. SharedDir is bind-mounted on itself (a slave of the same peer group, so
//!    propagation keeps reaching it) and becomes the root by `pivot_root`;
//! 3. the old root is detached (`umount2(MNT_DETACH)`): no path leads to the host's
//!    root any more.
//!
//! chroot mode only `chroot`s into SharedDir: for launchers that have already put the
//! daemon in its own namespaces (containers).

use std::fs::File;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::SandboxError;

/// What the daemon needs from outside SharedDir, opened before the root changes.
pub struct Outside {
    /// `/proc/self/fd`, for reopening `O_PATH` fds (fs/passthrough).
    pub proc_self_fd: File,
}

/// Opens what the daemon keeps from outside SharedDir.
pub fn open_outside() -> Result<Outside, SandboxError> {
    let proc_self_fd = File::open("/proc/self/fd").map_err(|e| {
        SandboxError::host("sandbox: opening /proc/self/fd before the root changes", e)
    })?;
    Ok(Outside { proc_self_fd })
}

/// Steps 1 to 3 above.
pub fn pivot_into(shared_dir: &Path) -> Result<(), SandboxError> {
    let dir = shared_dir.display();
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| {
        SandboxError::host(
            "sandbox: making every mount a slave (mount / MS_SLAVE|MS_REC)",
            e,
        )
    })?;
    mount(
        Some(shared_dir),
        shared_dir,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| {
        SandboxError::host(
            format!("sandbox: bind-mounting SharedDir {dir} on itself"),
            e,
        )
    })?;
    nix::unistd::chdir(shared_dir)
        .map_err(|e| SandboxError::host(format!("sandbox: chdir {dir}"), e))?;
    // pivot_root(".", "."): the old root ends up stacked under the new one, where the
    // detach below removes it (the idiom of pivot_root(2) and virtiofsd).
    nix::unistd::pivot_root(".", ".")
        .map_err(|e| SandboxError::host(format!("sandbox: pivot_root into SharedDir {dir}"), e))?;
    umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| SandboxError::host("sandbox: detaching the old root", e))?;
    nix::unistd::chdir("/")
        .map_err(|e| SandboxError::host("sandbox: chdir / after pivot_root", e))?;
    Ok(())
}

/// chroot mode.
pub fn chroot_into(shared_dir: &Path) -> Result<(), SandboxError> {
    nix::unistd::chroot(shared_dir)
        .map_err(|e| SandboxError::host(format!("sandbox: chroot {}", shared_dir.display()), e))?;
    nix::unistd::chdir("/").map_err(|e| SandboxError::host("sandbox: chdir / after chroot", e))?;
    Ok(())
}

/// Whether the mount holding `dir` is shared (in a peer group), so that mounts the
/// node agent adds under it later reach the daemon's namespace. Read from
/// /proc/self/mountinfo; None if it cannot be told.
pub fn is_shared_mount(dir: &Path) -> Option<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // The deepest mount point that is a prefix of `dir` holds it (the last one listed
    // wins among stacked mounts).
    let mut best: Option<(usize, bool)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(point) = fields.get(4) else { continue };
        let point = unescape(point);
        if !dir.starts_with(&point) {
            continue;
        }
        let depth = Path::new(&point).components().count();
        let shared = fields
            .iter()
            .skip(6)
            .take_while(|f| **f != "-")
            .any(|f| f.starts_with("shared:"));
        if best.is_none_or(|(d, _)| depth >= d) {
            best = Some((depth, shared));
        }
    }
    best.map(|(_, shared)| shared)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let n = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn the_root_mount_is_found() {
        assert!(is_shared_mount(Path::new("/")).is_some());
    }
}
