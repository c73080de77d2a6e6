//! `--poll-us` (src/device/poll.rs): after a ring runs dry, a worker whose requests
//! keep coming watches the ring for the window before it sleeps, so a request the
//! guest publishes then is served though the guest never kicks. Without the option
//! such a request waits for a kick.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{GetattrIn, Opcode};
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, Request};
use volfsd_harness::frontend::FuseOps;

fn getattr() -> Request {
    Request::new(Opcode::Getattr, ROOT)
        .arg(&GetattrIn::default())
        .reply_size(104)
}

/// Of `tries` GETATTRs each published `after` the previous reply and never kicked,
/// how many were answered without a kick (each is kicked after 200 ms unanswered,
/// so the next try starts from a served ring). `after` is longer than a worker
/// takes from its last reply to sleeping (a request published before that is found
/// by its re-check after re-enabling notifications, polling or not).
fn answered_unkicked(fc: &mut FuseClient, tries: usize, after: Duration) -> usize {
    let q = fc.request_queue(0).unwrap();
    let mut caught = 0;
    // Two kicked requests back to back: the second came within the window of the
    // ring running dry, so its drain polls.
    for _ in 0..2 {
        let t = q.submit(&getattr()).unwrap();
        q.kick().unwrap();
        q.wait_for(t, Duration::from_secs(10))
            .expect("a kicked GETATTR");
    }
    for _ in 0..tries {
        std::thread::sleep(after);
        let t = q.submit(&getattr()).unwrap();
        match q.wait_for(t, Duration::from_millis(200)) {
            Ok(c) => {
                c.into_reply().expect("a GETATTR reply");
                caught += 1;
            }
            Err(_) => {
                q.kick().unwrap();
                q.wait_for(t, Duration::from_secs(10))
                    .expect("kicked at last");
                // The next one follows a kicked drain: poll again from there.
                let t = q.submit(&getattr()).unwrap();
                q.kick().unwrap();
                q.wait_for(t, Duration::from_secs(10))
                    .expect("a kicked GETATTR");
            }
        }
    }
    caught
}

#[test]
fn a_request_published_within_the_window_is_served_without_a_kick() {
    if is_virtiofsd() {
        return;
    }
    let d = Daemon::start(
        "poll-on",
        &["--num-request-queues", "1", "--poll-us", "1000"],
    );
    let mut cfg = d.config();
    cfg.event_idx = true;
    let mut fc = d.client_with(&cfg);
    // 300 µs after the reply: inside the 1 ms window.
    let caught = answered_unkicked(&mut fc, 30, Duration::from_micros(300));
    assert!(
        caught > 0,
        "none of 30 unkicked requests was served by polling"
    );
    // Every request still answered right, kicked or not.
    fc.getattr(ROOT).unwrap();
    fc.disconnect();
}

#[test]
fn without_polling_an_unkicked_request_waits_for_its_kick() {
    if is_virtiofsd() {
        return;
    }
    let d = Daemon::start("poll-off", &["--num-request-queues", "1", "--poll-us", "0"]);
    let mut cfg = d.config();
    cfg.event_idx = true;
    let mut fc = d.client_with(&cfg);
    assert_eq!(answered_unkicked(&mut fc, 3, Duration::from_millis(20)), 0);
    fc.disconnect();
}
