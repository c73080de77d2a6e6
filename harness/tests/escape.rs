//! The escape suite: SharedDir restricted to allowed dirs, per-share read-only, and
//! confinement. Kept as its own test target so every later change is held to it.
//!
//! Two ways in: real syscalls on the stack mounted through /dev/fuse, and direct calls
//! into the stack for requests a guest kernel never sends (`LOOKUP ..`, forged ids).

mod mounted;

#[path = "escape/across_shares.rs"]
mod across_shares;
#[path = "escape/configuration.rs"]
mod configuration;
#[path = "escape/guest_view.rs"]
mod guest_view;
#[path = "escape/names.rs"]
mod names;
#[path = "escape/read_only.rs"]
mod read_only;
#[path = "escape/symlinks_and_moves.rs"]
mod symlinks_and_moves;

use std::ffi::CString;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::{Context, Entry, FileSystem};
use mounted::TempDir;
use volfsd::exports::fs::{self as vfs, CacheMode, PassthroughConfig, VolFs};

const ROOT: u64 = 1;

fn cfg() -> PassthroughConfig {
    PassthroughConfig::new(CacheMode::None, true)
}

/// SharedDir with `a` (rw), `b` (ro), `c` (rw) and `hidden` holding a secret.
fn platform_layout() -> TempDir {
    let sd = TempDir::new("sd");
    for d in ["a", "b", "c", "hidden"] {
        fs::create_dir(sd.path().join(d)).unwrap();
    }
    fs::write(sd.path().join("hidden/secret"), b"SECRET").unwrap();
    fs::write(sd.path().join("b/f"), b"ro-data").unwrap();
    fs::write(sd.path().join("a/f"), b"rw-data").unwrap();
    fs::write(sd.path().join("top-level-file"), b"x").unwrap();
    sd
}

fn stack(sd: &Path, allowed: &[&str]) -> Arc<VolFs> {
    let sd = sd.canonicalize().unwrap();
    let args: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
    let specs = volfsd::exports::config::parse_allowed_dirs(&sd, &args).unwrap();
    vfs::build(&sd, Some(&specs), false, cfg()).unwrap().fs
}

fn ctx() -> Context {
    Context::new()
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

fn lookup(fs: &VolFs, parent: u64, name: &str) -> std::io::Result<Entry> {
    fs.lookup(&ctx(), parent, &c(name))
}

fn listing(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}
