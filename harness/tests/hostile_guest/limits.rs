//! Bounded per guest: a guest that opens one file a million times gets ENFILE at the
//! volume's handle limit; the daemon's fds and memory stay bounded, other volumes keep
//! working and the control socket still answers. (volfsd only: virtiofsd has no
//! such limits, and no second volume.)

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{Opcode, OpenIn, OpenOut};
use volfsd_harness::frontend::fuse::Request;
use volfsd_harness::frontend::FuseOps;

use volfsd_harness::fixtures::control::{request, Resp};
use volfsd_harness::fixtures::host::*;
use volfsd_harness::fixtures::{self, Daemon, TestDir, RDONLY, ROOT};

const OPENS: usize = 1_000_000;
/// Below the daemon-wide fd budget on any machine this runs on (the default, 65,536,
/// can exceed RLIMIT_NOFILE where the daemon may not raise it), so the volume's own
/// limit is what stops the flood and the other volume keeps its share of fds.
const MAX_HANDLES: usize = 8_192;

#[test]
fn a_million_opens_of_one_file_get_enfile_at_the_limit() {
    if fixtures::is_virtiofsd() {
        eprintln!("skipped: virtiofsd has no per-volume limits");
        return;
    }
    let dir = TestDir::new("million-opens");
    for v in ["a", "b"] {
        std::fs::create_dir(dir.shared().join(v)).unwrap();
        std::fs::write(dir.shared().join(v).join("f"), b"data").unwrap();
    }
    let ctl = dir.control_socket();
    let ctl_arg = format!("--control-socket={}", ctl.display());
    let max = format!("--max-handles={MAX_HANDLES}");
    let d = Daemon::start_in(dir, &["--allowed-dir=a", "--allowed-dir=b", &ctl_arg, &max]);
    let mut cfg = d.config();
    cfg.queue_size = 1024;
    let mut c = d.client_with(&cfg);
    c.set_timeout(Duration::from_secs(30));
    let a = c.lookup(ROOT, "a").unwrap().nodeid;
    let fa = c.lookup(a, "f").unwrap().nodeid;
    let open = Request::new(Opcode::Open, fa)
        .arg(&OpenIn {
            flags: RDONLY,
            fuse_flags: 0,
        })
        .reply_of::<OpenOut>();
    let (mut ok, mut enfile, mut other) = (0usize, 0usize, 0usize);
    let mut handles = Vec::new();
    let q = c.request_queue(0).unwrap();
    let mut sent = 0;
    while sent < OPENS || q.in_flight() > 0 {
        while sent < OPENS && q.free_descriptors() >= 4 && q.in_flight() < 200 {
            q.submit(&open).unwrap();
            sent += 1;
        }
        q.kick().unwrap();
        for done in q.wait_completions(Duration::from_secs(30)).unwrap() {
            match done.into_reply() {
                Ok(r) => {
                    ok += 1;
                    handles.push(r.parse::<OpenOut>().unwrap().fh);
                }
                Err(e) if e.errno() == Some(libc::ENFILE) => enfile += 1,
                Err(e) => {
                    other += 1;
                    eprintln!("unexpected: {e}");
                }
            }
        }
    }
    assert_eq!(other, 0, "only successes and ENFILE");
    assert_eq!(ok, MAX_HANDLES, "opens served up to the limit");
    assert_eq!(enfile, OPENS - MAX_HANDLES);
    let fds = fd_count(d.pid());
    let rss = status_kb(d.pid(), "RssAnon");
    eprintln!("after {OPENS} opens: {fds} fds, RssAnon {rss} kB");
    assert!(fds < MAX_HANDLES + 256, "{fds} fds");
    assert!(rss < 64 * 1024, "RssAnon {rss} kB");
    // The other volume keeps working, opens included.
    let b = c.lookup(ROOT, "b").unwrap().nodeid;
    let fb = c.lookup(b, "f").unwrap().nodeid;
    let fh = c.open(fb, RDONLY).expect("open in volume b").fh;
    assert_eq!(c.read(fb, fh, 0, 16).unwrap(), b"data");
    // The control API answers and counts the handles.
    let Resp { status, body, .. } = request(&ctl, "GET", "/volumes/a", None);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("\"open_handles\":{MAX_HANDLES}")),
        "{body}"
    );
    // Giving handles back makes room again.
    for fh in handles.drain(..16) {
        c.release(fa, fh, 0).unwrap();
    }
    c.open(fa, RDONLY).expect("open after releases");
}
