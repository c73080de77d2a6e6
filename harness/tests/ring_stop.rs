//! A stopped ring gets nothing: once GET_VRING_BASE has returned, the daemon writes no
//! reply and no used-ring entry to that queue until the frontend starts it again.
//!
//! A VMM stops the rings (SET_VRING_ENABLE 0, GET_VRING_BASE) to pause a VM and at a
//! live migration's switch-over, then does its last dirty-log sync and sends the
//! returned index to the destination. A reply written after that is neither copied
//! nor counted: the guest waits for it for ever. So:
//! - a request being served when GET_VRING_BASE comes is finished first, and the
//!   index returned counts it as answered (it equals the used index);
//! - a lock wait that ends while the ring is stopped keeps its answer until the ring
//!   is started again on the same rings, and a new driver's rings never get it.
//!
//! The throttled requests' side of this is in qos.rs
//! (a_paused_queue_gets_no_answer_until_it_is_started_again_on_the_same_rings).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{Opcode, OpenIn, OpenOut, OutHeader};
use vm_memory::ByteValued;
use volfsd_harness::fixtures::guest::create_with;
use volfsd_harness::fixtures::host::{host_lock, host_sees_lock, poll};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{self, Daemon, RDONLY, ROOT};
use volfsd_harness::frontend::fuse::{ChainPart, FuseOps, FuseQueue, InitParams};
use volfsd_harness::frontend::{GuestBuffer, Request, Segment};

const OUT_HEADER: u64 = std::mem::size_of::<OutHeader>() as u64;

/// A write lease the test holds on a host file: the daemon's open(2) of that file
/// then waits in the kernel until the lease is given up (or lease-break-time, 45 s
/// by default, passes). That is a request the test can hold in the middle of being
/// served.
struct Lease(std::fs::File);

impl Lease {
    fn take(path: &Path) -> Lease {
        // The kernel tells the holder of a lease being broken with SIGIO, whose
        // default action ends the process.
        // SAFETY: sets the disposition of one signal to "ignore"; no handler runs.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        let f = std::fs::File::open(path).unwrap();
        // SAFETY: fcntl on an open fd, with an int argument.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
        assert_eq!(r, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
        Lease(f)
    }

    /// Whether someone's open(2) is waiting for the lease: the lease then reads as
    /// the type it is being broken to.
    fn is_being_broken(&self) -> bool {
        // SAFETY: fcntl on an open fd, no argument.
        let r = unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_GETLEASE) };
        r != libc::F_WRLCK
    }
}

/// A 16-byte reply buffer at a known place, poisoned: a reply written there shows.
fn reply_buffer(memory: &std::sync::Arc<volfsd_harness::frontend::GuestMemory>) -> GuestBuffer {
    let b = memory.alloc(OUT_HEADER).unwrap();
    b.fill(0xa5).unwrap();
    b
}

fn untouched(b: &GuestBuffer) -> bool {
    b.read_at(0, OUT_HEADER).unwrap() == [0xa5; OUT_HEADER as usize]
}

fn header_of(b: &GuestBuffer) -> OutHeader {
    *OutHeader::from_slice(&b.read_at(0, OUT_HEADER).unwrap()).unwrap()
}

/// Submits a SETLKW whose reply goes to `reply`; returns its token.
fn submit_setlkw(q: &mut FuseQueue, node: u64, fh: u64, unique: u64, reply: &GuestBuffer) -> u64 {
    let mut chain =
        lock_request(Opcode::Setlkw, node, fh, 7, libc::F_WRLCK, false).to_chain(unique);
    chain.writable = vec![ChainPart::Raw(Segment::new(
        reply.addr(),
        OUT_HEADER as u32,
    ))];
    let token = q.submit_chain(&chain).unwrap();
    q.kick().unwrap();
    token
}

/// The daemon's threads named `volfsd-lockwait`.
fn lock_waiters(pid: i32) -> usize {
    use volfsd_harness::fixtures::inject::{thread_ids, thread_name};
    thread_ids(pid)
        .into_iter()
        .filter(|t| thread_name(pid, *t) == "volfsd-lockwait")
        .count()
}

#[test]
fn get_vring_base_returns_once_the_request_being_served_is_answered() {
    let d = Daemon::start("ring-stop-busy", &[]);
    std::fs::write(d.host("slow"), b"data").unwrap();
    let mut c = d.client();
    let node = c.lookup(ROOT, "slow").unwrap().nodeid;
    let lease = Lease::take(&d.host("slow"));
    let (mut device, _hiprio, mut queues) = c.into_parts();
    let q = &mut queues[0];
    let open = Request::new(Opcode::Open, node)
        .arg(&OpenIn {
            flags: RDONLY,
            ..Default::default()
        })
        .reply_of::<OpenOut>();
    let token = q.submit(&open).unwrap();
    q.kick().unwrap();
    assert!(
        poll(Duration::from_secs(10), || lease.is_being_broken()),
        "the daemon's open never reached the lease"
    );
    let used = q.ring_mut().used_idx().unwrap();

    // The VM is paused (or switched over) while the OPEN is being served.
    let index = q.index();
    let (tx, rx) = mpsc::channel();
    let stopper = std::thread::spawn(move || {
        let base = device.stop_queue(index);
        let _ = tx.send(());
        (device, base)
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "GET_VRING_BASE returned while a popped request was still being served"
    );
    assert_eq!(q.ring_mut().used_idx().unwrap(), used, "not answered yet");

    // The open goes on: the request is answered, and only then the ring stops.
    drop(lease);
    let (mut device, base) = stopper.join().unwrap();
    let base = base.expect("GET_VRING_BASE");
    assert_eq!(
        base as u16,
        q.ring_mut().used_idx().unwrap(),
        "the index returned counts only answered requests"
    );
    assert_eq!(base as u16, used.wrapping_add(1));
    let done = q.poll_completions().unwrap();
    assert_eq!(done.len(), 1, "answered before GET_VRING_BASE returned");
    assert_eq!(done[0].token, token);
    let fh = done[0]
        .clone()
        .into_reply()
        .unwrap()
        .parse::<OpenOut>()
        .unwrap()
        .fh;

    // Started again where it stopped, the session carries on.
    device.resume_queue(q.ring_mut(), base).unwrap();
    q.release(node, fh, 0).expect("served after the resume");
}

#[test]
fn a_lock_granted_while_the_ring_is_stopped_is_answered_once_it_runs_again() {
    if fixtures::is_virtiofsd() {
        return; // virtiofsd 1.14 does not serve remote POSIX locks.
    }
    let d = Daemon::start("ring-stop-lock", &[]);
    let mut c = d.client();
    let (node, fh) = create_with(&mut c, ROOT, "locked", b"data");
    let holder = host_lock(&d.host("locked"));
    let (mut device, _hiprio, mut queues) = c.into_parts();
    let q = &mut queues[0];
    let reply = reply_buffer(device.memory());
    let token = submit_setlkw(q, node, fh, 1001, &reply);
    assert!(
        poll(Duration::from_secs(10), || lock_waiters(d.pid()) == 1),
        "no lock-wait thread"
    );
    let used = q.ring_mut().used_idx().unwrap();
    let base = device.stop_queue(q.index()).unwrap();
    assert_eq!(
        base as u16,
        used.wrapping_add(1),
        "the SETLKW was popped and is owed an answer"
    );

    // The lock is granted while the ring is stopped: the daemon takes it ...
    drop(holder);
    assert!(
        poll(Duration::from_secs(10), || host_sees_lock(
            &d.host("locked")
        )),
        "the daemon never took the lock"
    );
    // ... but writes nothing to the stopped ring.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(q.ring_mut().used_idx().unwrap(), used, "no used entry");
    assert!(untouched(&reply), "no reply: {:?}", header_of(&reply));

    // Started again on the same rings where it stopped: the answer comes.
    device.resume_queue(q.ring_mut(), base).unwrap();
    let done = q
        .wait_for(token, Duration::from_secs(10))
        .expect("the SETLKW is answered once the ring runs");
    assert_eq!(u64::from(done.used_len), OUT_HEADER);
    let h = header_of(&reply);
    assert_eq!((h.unique, h.error, u64::from(h.len)), (1001, 0, OUT_HEADER));
    assert_eq!(q.ring_mut().used_idx().unwrap(), base as u16);
    assert!(
        poll(Duration::from_secs(2), || lock_waiters(d.pid()) == 0),
        "the lock-wait thread ended"
    );
    q.getattr(node).expect("the session carries on");
}

#[test]
fn a_lock_granted_while_the_ring_is_stopped_never_reaches_a_new_driver() {
    if fixtures::is_virtiofsd() {
        return; // virtiofsd 1.14 does not serve remote POSIX locks.
    }
    let d = Daemon::start("ring-stop-lock-reboot", &[]);
    let mut c = d.client();
    let (node, fh) = create_with(&mut c, ROOT, "locked", b"data");
    let holder = host_lock(&d.host("locked"));
    let (mut device, _hiprio, mut queues) = c.into_parts();
    let q = &mut queues[0];
    let reply = reply_buffer(device.memory());
    submit_setlkw(q, node, fh, 1001, &reply);
    assert!(
        poll(Duration::from_secs(10), || lock_waiters(d.pid()) == 1),
        "no lock-wait thread"
    );
    let used = q.ring_mut().used_idx().unwrap();
    device.stop_queue(q.index()).unwrap();
    drop(holder);
    assert!(
        poll(Duration::from_secs(10), || host_sees_lock(
            &d.host("locked")
        )),
        "the daemon never took the lock"
    );

    // The guest reboots: its new driver sets the queue up on new rings from 0.
    let ring = device.restart_queue(q.index(), 256).unwrap();
    let mut fresh = FuseQueue::new(ring, device.memory().clone(), q.uniques());
    fresh
        .init(&InitParams::default())
        .expect("INIT of the new driver");
    fresh.getattr(ROOT).expect("the new session serves");
    // The old answer goes nowhere: not to the old rings ...
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        assert_eq!(q.ring_mut().used_idx().unwrap(), used);
        assert!(untouched(&reply));
        std::thread::sleep(Duration::from_millis(20));
    }
    // ... nor to the new one, and the old session's lock is let go.
    assert!(fresh.poll_completions().unwrap().is_empty());
    assert!(
        poll(Duration::from_secs(5), || lock_waiters(d.pid()) == 0),
        "the lock-wait thread ended"
    );
    assert!(
        poll(Duration::from_secs(5), || !host_sees_lock(
            &d.host("locked")
        )),
        "the old session's lock is released"
    );
    fresh.getattr(ROOT).unwrap();
    assert!(fresh.poll_completions().unwrap().is_empty());
    assert!(untouched(&reply));
}
