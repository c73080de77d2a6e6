//! Broken rings: a frontend that breaks the virtqueue's rules gets that queue
//! stopped, with one log line; the worker does not spin and other queues serve on.

use std::time::Duration;

use volfsd_harness::frontend::fuse::{FuseClient, Request};
use volfsd_harness::frontend::{FuseOps, Segment};

use fuse_backend_rs::abi::fuse_abi::Opcode;

use volfsd_harness::fixtures::host::*;
use volfsd_harness::fixtures::{self, Daemon, ROOT};

/// Two request queues (virtiofsd serves one: then the bad ring's queue is its only
/// one, and only the CPU check applies).
fn two_queue_client(d: &Daemon) -> FuseClient {
    let mut cfg = d.config();
    cfg.request_queues = if fixtures::is_virtiofsd() { 1 } else { 2 };
    cfg.event_idx = true;
    let mut c = d.client_with(&cfg);
    c.set_timeout(Duration::from_secs(5));
    c
}

/// The daemon's CPU over 2 s stays under 5%, and queue 2 still answers.
fn assert_queue_stopped_quietly(d: &Daemon, c: &mut FuseClient) {
    // Let the daemon see the kick first.
    std::thread::sleep(Duration::from_millis(300));
    let cpu = cpu_seconds_over(d.pid(), Duration::from_secs(2));
    assert!(
        cpu < 0.1,
        "daemon used {cpu:.2} s of CPU in 2 s after the bad ring"
    );
    let log = d.log();
    if !fixtures::is_virtiofsd() {
        c.use_request_queue(1).unwrap();
        c.getattr(ROOT).expect("the other queue serves");
        let stops = log.matches("stopped").count();
        assert_eq!(stops, 1, "one log line for the stopped queue:\n{log}");
    }
    assert!(log.len() < 64 * 1024, "log grew to {} bytes", log.len());
}

#[test]
fn bogus_avail_index_stops_the_queue_without_spinning() {
    let d = Daemon::start("bogus-avail", &[]);
    let mut c = two_queue_client(&d);
    c.getattr(ROOT).expect("queue 1 works first");
    c.request_queue(0)
        .unwrap()
        .ring_mut()
        .publish_bogus_avail_idx(40_000)
        .expect("publish a bogus avail idx");
    assert_queue_stopped_quietly(&d, &mut c);
}

#[test]
fn descriptor_loop_stops_the_queue_without_spinning() {
    let d = Daemon::start("desc-loop", &[]);
    let mut c = two_queue_client(&d);
    c.getattr(ROOT).expect("queue 1 works first");
    // A well-formed GETATTR header in a chain whose two descriptors point at each
    // other.
    let chain = Request::new(Opcode::Getattr, ROOT)
        .arg(&[0u8; 16])
        .to_chain(999);
    let mut bytes = Vec::new();
    for part in chain.readable {
        if let volfsd_harness::frontend::fuse::ChainPart::Data(b) = part {
            bytes.extend(b);
        }
    }
    let memory = c.device().memory().clone();
    let buf = memory.alloc(bytes.len() as u64).unwrap();
    buf.write_at(0, &bytes).unwrap();
    c.request_queue(0)
        .unwrap()
        .ring_mut()
        .add_looping_chain(&Segment::of(&buf))
        .expect("publish a looping chain");
    assert_queue_stopped_quietly(&d, &mut c);
}
