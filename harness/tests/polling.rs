//! `--poll-us` (src/device/poll.rs): after a ring runs dry, a worker whose requests
//! keep coming watches the ring for the window before it sleeps, so a request the
//! guest publishes then is served though the guest never kicks. Without the option
//! such a request waits for a kick.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{GetattrIn, Opcode};
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, FuseQueue, Request};
use volfsd_harness::frontend::FuseOps;

fn getattr() -> Request {
    Request::new(Opcode::Getattr, ROOT)
        .arg(&GetattrIn::default())
        .reply_size(104)
}

/// Two GETATTRs published together and kicked once: their drain serves two
/// requests, so requests keep coming and it polls after the ring runs dry, however
/// long ago the ring last ran dry (an earlier try's drain).
fn two_kicked(q: &mut FuseQueue) {
    let tokens = [q.submit(&getattr()).unwrap(), q.submit(&getattr()).unwrap()];
    q.kick().unwrap();
    for t in tokens {
        q.wait_for(t, Duration::from_secs(10))
            .expect("a kicked GETATTR");
    }
}

/// Of `tries` GETATTRs each published `after` a drain that served two requests
/// and never kicked, how many were answered without a kick (each is kicked after
/// 200 ms unanswered). `after` is longer than a worker takes from its last reply to
/// sleeping (a request published before that is found by its re-check after
/// re-enabling notifications, polling or not). Each try starts 5 ms after the last
/// reply, past the window: only the two requests of its drain make it poll.
fn answered_unkicked(fc: &mut FuseClient, tries: usize, after: Duration) -> usize {
    let q = fc.request_queue(0).unwrap();
    let mut caught = 0;
    for _ in 0..tries {
        std::thread::sleep(Duration::from_millis(5));
        two_kicked(q);
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
    // 300 µs after the reply: inside the 1 ms window. The worker must be on a CPU
    // through the window: on a loaded 2-core host (a build beside the tests) a round
    // of 30 can miss every time, so up to 5 rounds, the first catch ending it.
    let caught = (0..5)
        .map(|_| answered_unkicked(&mut fc, 30, Duration::from_micros(300)))
        .find(|&c| c > 0)
        .unwrap_or(0);
    assert!(
        caught > 0,
        "none of 5 x 30 unkicked requests was served by polling"
    );
    // Every request still answered right, kicked or not.
    fc.getattr(ROOT).unwrap();
    fc.disconnect();
}

#[test]
fn one_request_at_a_time_past_the_window_does_not_poll() {
    if is_virtiofsd() {
        return;
    }
    let d = Daemon::start(
        "poll-lone",
        &["--num-request-queues", "1", "--poll-us", "1000"],
    );
    let mut cfg = d.config();
    cfg.event_idx = true;
    let mut fc = d.client_with(&cfg);
    let q = fc.request_queue(0).unwrap();
    for _ in 0..3 {
        // 5 ms after the ring ran dry, past the 1 ms window: one request, kicked.
        std::thread::sleep(Duration::from_millis(5));
        let t = q.submit(&getattr()).unwrap();
        q.kick().unwrap();
        q.wait_for(t, Duration::from_secs(10))
            .expect("a kicked GETATTR");
        // Its drain served one request that did not come within the window: it
        // slept at once, so the next one waits for its kick.
        std::thread::sleep(Duration::from_micros(300));
        let t = q.submit(&getattr()).unwrap();
        assert!(
            q.wait_for(t, Duration::from_millis(200)).is_err(),
            "a lone request's drain polled"
        );
        q.kick().unwrap();
        q.wait_for(t, Duration::from_secs(10))
            .expect("kicked at last");
    }
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
