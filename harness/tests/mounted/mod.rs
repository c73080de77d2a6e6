//! Test harness: mounts volfsd's file system stack on the host through `/dev/fuse`
//! (fuse-backend-rs `fusedev`), so tests drive it with real syscalls.
//!
//! The stack is the one the daemon serves over virtio; only the transport differs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use fuse_backend_rs::transport::FuseSession;
use volfsd::exports::fs::file_handle::FileHandleMode;
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig, ShareSpec};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("volfsd-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Mounted {
    pub mnt: TempDir,
    pub server: Arc<FsServer>,
    session: FuseSession,
    workers: Vec<JoinHandle<()>>,
}

pub struct MountOptions {
    pub readonly: bool,
    pub cache: CacheMode,
    pub xattr: bool,
    pub threads: usize,
    /// `--allowed-dir` arguments; None serves the whole SharedDir.
    pub allowed: Option<Vec<String>>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            readonly: false,
            cache: CacheMode::None,
            xattr: false,
            threads: 2,
            allowed: None,
        }
    }
}

impl Mounted {
    /// Serves only the given allowed dirs (`PATH[:ro|:rw]`) under a virtual root.
    pub fn volumes(shared: &Path, allowed: &[&str]) -> Self {
        Self::with(
            shared,
            MountOptions {
                allowed: Some(allowed.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            },
        )
    }

    pub fn new(shared: &Path) -> Self {
        Self::with(shared, MountOptions::default())
    }

    pub fn with(shared: &Path, opts: MountOptions) -> Self {
        let shared = shared.canonicalize().unwrap();
        let specs: Option<Vec<ShareSpec>> = opts.allowed.as_ref().map(|a| {
            volfsd::exports::config::parse_allowed_dirs(&shared, a).expect("valid --allowed-dir")
        });
        let fs = fs::build(
            &shared,
            specs.as_deref(),
            opts.readonly,
            PassthroughConfig {
                file_handles: file_handles_from_env(),
                ..PassthroughConfig::new(opts.cache, opts.xattr)
            },
        )
        .expect("building the file system stack");
        let server = Arc::new(FsServer::new(&fs));
        let mnt = TempDir::new("mnt");
        let mut session =
            FuseSession::new(mnt.path(), "volfsd-test", "", false).expect("fuse session");
        session.mount().expect("mounting through /dev/fuse");
        let mut workers = Vec::new();
        for _ in 0..opts.threads {
            let mut channel = session.new_channel().expect("fuse channel");
            let server = server.clone();
            workers.push(std::thread::spawn(move || loop {
                match channel.get_request() {
                    Ok(Some((reader, writer))) => {
                        let _ = server.handle(reader, writer.into());
                    }
                    Ok(None) | Err(_) => return,
                }
            }));
        }
        Mounted {
            mnt,
            server,
            session,
            workers,
        }
    }

    pub fn path(&self) -> &Path {
        self.mnt.path()
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.mnt.path().join(rel)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.session.umount();
        let _ = self.session.wake();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// `VOLFSD_TEST_FILE_HANDLES=prefer|mandatory` mounts with nodes kept by file handle
/// (as the daemon's `--inode-file-handles`); unset or `never`: O_PATH fds.
fn file_handles_from_env() -> FileHandleMode {
    match std::env::var("VOLFSD_TEST_FILE_HANDLES").as_deref() {
        Ok("prefer") => FileHandleMode::Prefer,
        Ok("mandatory") => FileHandleMode::Mandatory,
        Ok("never") | Err(_) => FileHandleMode::Never,
        Ok(other) => panic!("VOLFSD_TEST_FILE_HANDLES={other}: never, prefer or mandatory"),
    }
}
