//! Target `control`: the control socket's HTTP framing (`control::http::read_request`)
//! and its API (`control::Api::handle`) on a SharedDir with volumes to attach.
//!
//! Input: a byte stream as a client would send on one kept-alive connection; up to
//! [`MAX_REQUESTS`] requests are read from it and each is answered by the API.
//!
//! Oracle: no panic; every reply has a known status and a JSON body (empty for 204),
//! errors with a non-empty `error`; every attached volume's host path lies strictly
//! inside SharedDir, is no symlink, and its name passes the volume-name rule; the
//! read-only volume stays unchanged.
//! State is bounded: after each input the volumes it attached are detached.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use volfsd::exports::control::http::{read_request, reason, ReadError};
use volfsd::exports::control::Api;
use volfsd::exports::device::DeviceStats;
use volfsd::exports::fs::names::valid_volume_name;
use volfsd::exports::fs::{self, CacheMode, PassthroughConfig, Stack};

use crate::common::{tree_checksum, Scratch};

const MAX_REQUESTS: usize = 8;

struct State {
    scratch: Scratch,
    stack: Stack,
    api: Api,
    initial: HashSet<String>,
    ro_sum: u64,
}

fn state() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
    S.get_or_init(|| {
        let scratch = Scratch::new("control", None);
        let p = scratch.path().to_path_buf();
        for d in ["data", "models", "vols/a", "vols/b", "hidden", "ro"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        std::fs::write(p.join("hidden/secret"), b"SECRET").unwrap();
        std::fs::write(p.join("ro/f"), b"ro-data").unwrap();
        std::fs::write(p.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("hidden", p.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", p.join("out")).unwrap();
        let specs = volfsd::exports::config::parse_allowed_dirs(
            &p,
            &["data".to_string(), "ro:ro".to_string()],
        )
        .unwrap();
        let stack = fs::build(
            &p,
            Some(&specs),
            false,
            PassthroughConfig::new(CacheMode::None, false),
        )
        .expect("building the file system stack (needs root for open_tree)");
        let api = Api::new(
            stack.volumes.clone(),
            p.clone(),
            p.clone(),
            Arc::new(DeviceStats::default()),
        );
        let initial = stack
            .volumes
            .list()
            .iter()
            .map(|s| s.share.name.clone())
            .collect();
        let ro_sum = tree_checksum(&p.join("ro"));
        State {
            scratch,
            stack,
            api,
            initial,
            ro_sum,
        }
    })
}

fn check_reply(status: u16, body: &str) {
    assert_ne!(
        reason(status),
        "Unknown",
        "status {status} has no reason phrase"
    );
    if status == 204 {
        assert!(body.is_empty());
        return;
    }
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("reply {status} is not JSON ({e}): {body:?}"));
    if status >= 400 {
        let err = v.get("error").and_then(|e| e.as_str());
        assert!(
            err.is_some_and(|e| !e.is_empty()),
            "error reply without an error message: {body}"
        );
    }
}

pub fn run_control(data: &[u8]) {
    let st = state();
    let shared = st.scratch.path();
    let mut stream: &[u8] = data;
    let mut buf = Vec::new();
    for _ in 0..MAX_REQUESTS {
        match read_request(&mut stream, &mut buf, Some(Duration::from_secs(5))) {
            Ok(req) => {
                let reply = st.api.handle(&req.method, &req.path, &req.body);
                check_reply(reply.status, &reply.body);
                if crate::fuse::trace() {
                    eprintln!(
                        "control: {} {} -> {} {}",
                        req.method, req.path, reply.status, reply.body
                    );
                }
                if req.close {
                    break;
                }
            }
            Err(ReadError::Closed) | Err(ReadError::Io(_)) => break,
            Err(ReadError::Reply(status, msg)) => {
                assert!(
                    status >= 400 && reason(status) != "Unknown",
                    "{status} {msg}"
                );
                break;
            }
        }
    }
    // Every attached volume lies inside SharedDir; detach what this input attached.
    let mut attached = Vec::new();
    for s in st.stack.volumes.list() {
        let share = &s.share;
        assert!(
            share.host_path.starts_with(shared) && share.host_path != shared,
            "volume {} attached at {} outside {}",
            share.name,
            share.host_path.display(),
            shared.display()
        );
        assert!(valid_volume_name(&share.name) || share.name.split('/').all(valid_volume_name));
        assert!(!Path::new(&share.host_path).is_symlink());
        if !st.initial.contains(&share.name) {
            attached.push(share.name.clone());
        }
    }
    // Detach waits for every holder of the share to let go: the infos above too.
    for name in attached {
        st.stack.volumes.detach(&name);
    }
    assert_eq!(
        tree_checksum(&shared.join("ro")),
        st.ro_sum,
        "the read-only volume changed"
    );
}
