//! Per-volume QoS through the vhost-user socket: a throttled request leaves the ring
//! and waits in its volume's line while the other volume's requests on the same queue
//! are served; FORGET and INTERRUPT are never held back; lifting the limit or
//! detaching the volume answers the waiting requests at once; a new driver drops
//! them; a limited volume never gets more than its buckets allow.
//!
//! Nothing here asserts a speed: the only time-based check is an upper bound (a
//! volume cannot go faster than its limit, however fast the machine), and the waits
//! are liveness timeouts. The rates against the target (1,000 ops/s ± 5%, the
//! neighbour's share) are measured by benches/qos.sh.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{ForgetIn, GetattrIn, InterruptIn, Opcode, ReadIn};
use serde_json::{json, Value};
use volfsd_harness::fixtures::control::Ctl;
use volfsd_harness::fixtures::mounts::MountGuard;
use volfsd_harness::fixtures::{TestDir, RDONLY, ROOT};
use volfsd_harness::frontend::fuse::{FuseQueue, InitParams, Request};
use volfsd_harness::frontend::FuseOps;

/// A bucket that gives one request, then one a minute: the second request waits
/// until the test does something about it.
fn one_then_wait() -> Value {
    json!({ "ops": { "size": 1, "refill_time_ms": 60_000 } })
}

fn getattr(nodeid: u64) -> Request {
    Request::new(Opcode::Getattr, nodeid)
        .arg(&GetattrIn::default())
        .reply_size(104)
}

fn patch(c: &Ctl, name: &str, limit: Value) -> Value {
    c.req(
        "PATCH",
        &format!("/volumes/{name}"),
        Some(&json!({ "rate_limiter": limit }).to_string()),
    )
    .expect(200)
    .json()
}

/// Waits until `n` requests of volume `name` wait in the daemon.
fn wait_until_waiting(c: &Ctl, name: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.volume(name)["qos"]["waiting_requests"] != n {
        assert!(Instant::now() < deadline, "{}", c.volume(name));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Collects completions until `want` have come, or `timeout` passes.
fn collect(q: &mut FuseQueue, want: usize, timeout: Duration) -> Vec<(u64, Result<u64, i32>)> {
    let deadline = Instant::now() + timeout;
    let mut done = Vec::new();
    while done.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        for c in q.wait_completions(left).unwrap() {
            let token = c.token;
            let used = c.used_len;
            let r = match c.into_reply() {
                Ok(_) => Ok(u64::from(used)),
                Err(e) => Err(match e {
                    volfsd_harness::frontend::Error::Errno { errno, .. } => errno,
                    volfsd_harness::frontend::Error::NoReply { .. } => 0,
                    other => panic!("bad reply: {other}"),
                }),
            };
            done.push((token, r));
        }
    }
    done
}

/// Two volumes, `a` limited to one request then one a minute, `b` unlimited; returns
/// the daemon, a client, and the node ids of a, b and a/f. a's one token is spent.
fn two_volumes(test: &str) -> (Ctl, volfsd_harness::frontend::FuseClient, u64, u64, u64) {
    let c = Ctl::start(test, &["--num-request-queues", "1"]);
    c.mkdir("a");
    c.mkdir("b");
    std::fs::write(c.shared().join("a/f"), vec![7u8; 64 << 10]).unwrap();
    let put = c
        .put(
            "a",
            &json!({ "path": "a", "rate_limiter": one_then_wait() }),
        )
        .expect(201)
        .json();
    assert_eq!(put["rate_limiter"], one_then_wait_full());
    c.attach("b", "b");
    let mut fc = c.client();
    let a = fc.lookup(ROOT, "a").unwrap().nodeid;
    let b = fc.lookup(ROOT, "b").unwrap().nodeid;
    // The virtual root's lookups cost a nothing; this takes its one token.
    let f = fc.lookup(a, "f").unwrap().nodeid;
    (c, fc, a, b, f)
}

/// `one_then_wait` as the daemon reports it (defaults filled in).
fn one_then_wait_full() -> Value {
    json!({ "ops": { "size": 1, "one_time_burst": 0, "refill_time_ms": 60_000 }, "bandwidth": null })
}

#[test]
fn a_throttled_volume_waits_out_of_the_ring_while_its_neighbour_on_the_same_queue_is_served() {
    let (c, mut fc, a, b, _) = two_volumes("qos-neighbour");
    let q = fc.request_queue(0).unwrap();
    // Three requests for a, then three for b, on the one request queue.
    let for_a: Vec<u64> = (0..3).map(|_| q.submit(&getattr(a)).unwrap()).collect();
    let for_b: BTreeSet<u64> = (0..3).map(|_| q.submit(&getattr(b)).unwrap()).collect();
    q.kick().unwrap();
    let done = collect(q, 3, Duration::from_secs(10));
    let tokens: BTreeSet<u64> = done.iter().map(|d| d.0).collect();
    assert_eq!(tokens, for_b, "b's requests are served past a's: {done:?}");
    assert!(done.iter().all(|d| d.1.is_ok()), "{done:?}");
    let v = c.volume("a");
    assert_eq!(v["qos"]["waiting_requests"], 3, "{v}");
    assert_eq!(v["qos"]["throttled_requests"], 3, "{v}");
    assert_eq!(q.in_flight(), 3, "a's requests are still owed");

    // The limit lifted at runtime: a's requests are answered, in order, correctly.
    let v = patch(&c, "a", Value::Null);
    assert!(v.get("rate_limiter").is_none(), "{v}");
    let done = collect(q, 3, Duration::from_secs(10));
    let order: Vec<u64> = done.iter().map(|d| d.0).collect();
    assert_eq!(order, for_a, "a's line is served in order: {done:?}");
    assert!(done.iter().all(|d| d.1 == Ok(16 + 104)), "{done:?}");
    let v = c.volume("a");
    assert_eq!(v["qos"]["waiting_requests"], 0, "{v}");
    assert!(v["qos"]["wait_seconds"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn forget_and_interrupt_are_never_held_back() {
    let (c, mut fc, a, _, f) = two_volumes("qos-forget");
    let q = fc.request_queue(0).unwrap();
    let waiting = q.submit(&getattr(a)).unwrap();
    q.kick().unwrap();
    // FORGET of a node of the throttled volume, on the same request queue, and
    // INTERRUPT of the waiting request: both come back (no reply, used len 0).
    let forget = Request::new(Opcode::Forget, f)
        .arg(&ForgetIn { nlookup: 1 })
        .no_reply();
    q.call_no_reply(&forget)
        .expect("FORGET is returned at once");
    let interrupt = Request::new(Opcode::Interrupt, a)
        .arg(&InterruptIn { unique: waiting })
        .no_reply();
    q.call_no_reply(&interrupt)
        .expect("INTERRUPT is returned at once");
    // The hiprio queue is never throttled either.
    let hi = fc.hiprio_queue();
    let forget_a = Request::new(Opcode::Forget, a)
        .arg(&ForgetIn { nlookup: 1 })
        .no_reply();
    hi.call_no_reply(&forget_a).expect("hiprio FORGET");
    let v = c.volume("a");
    assert_eq!(v["qos"]["waiting_requests"], 1, "{v}");
    // The waiting request is still answered once its turn comes.
    patch(
        &c,
        "a",
        json!({ "ops": { "size": 1000, "refill_time_ms": 1000 } }),
    );
    let q = fc.request_queue(0).unwrap();
    let done = collect(q, 1, Duration::from_secs(10));
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].0, waiting);
}

/// A request whose copy would exceed 8 KiB is never held: the daemon would have to
/// keep its copy, and a guest could fill a queue with them. It is served at once
/// and charged to the volume.
#[test]
fn a_large_request_is_served_at_once_and_charged() {
    let c = Ctl::start("qos-large", &["--num-request-queues", "1", "--xattr"]);
    c.mkdir("a");
    std::fs::write(c.shared().join("a/f"), b"x").unwrap();
    c.put(
        "a",
        &json!({ "path": "a", "rate_limiter": one_then_wait() }),
    )
    .expect(201);
    let mut fc = c.client();
    let a = fc.lookup(ROOT, "a").unwrap().nodeid;
    let f = fc.lookup(a, "f").unwrap().nodeid; // a's one token
                                               // 16 KiB of value: answered now (the host takes it or refuses it: either is an
                                               // answer), not after the minute the bucket needs.
    let value = vec![b'v'; 16 << 10];
    let r = fc.setxattr(f, "user.big", &value, 0);
    eprintln!("16 KiB SETXATTR on the throttled volume: {r:?}");
    let v = c.volume("a");
    assert_eq!(v["qos"]["throttled_requests"], 0, "{v}");
    assert_eq!(v["qos"]["waiting_requests"], 0, "{v}");
    // It was charged: a small request now waits.
    let q = fc.request_queue(0).unwrap();
    let small = q.submit(&getattr(f)).unwrap();
    q.kick().unwrap();
    wait_until_waiting(&c, "a", 1);
    patch(&c, "a", Value::Null);
    let done = collect(q, 1, Duration::from_secs(10));
    assert_eq!(done.first().map(|d| d.0), Some(small), "{done:?}");
}

/// A READ asking for more than the largest payload is refused with EINVAL, and
/// costs the volume's bandwidth bucket no more than the largest payload: a guest's
/// bogus size must not put its volume in debt for hours.
#[test]
fn an_oversized_read_costs_at_most_the_largest_payload() {
    let c = Ctl::start("qos-oversized", &["--num-request-queues", "1"]);
    c.mkdir("a");
    std::fs::write(c.shared().join("a/f"), vec![3u8; 8192]).unwrap();
    c.put(
        "a",
        &json!({ "path": "a", "rate_limiter": { "bandwidth": { "size": 1 << 20, "refill_time_ms": 100 } } }),
    )
    .expect(201);
    let mut fc = c.client();
    let a = fc.lookup(ROOT, "a").unwrap().nodeid;
    let f = fc.lookup(a, "f").unwrap().nodeid;
    let fh = fc.open(f, RDONLY).unwrap().fh;
    let read = |size: u32| {
        Request::new(Opcode::Read, f)
            .arg(&ReadIn {
                fh,
                offset: 0,
                size,
                ..Default::default()
            })
            .reply_size(16 + 4096)
    };
    let q = fc.request_queue(0).unwrap();
    let bogus = q.submit(&read(u32::MAX)).unwrap();
    q.kick().unwrap();
    let done = collect(q, 1, Duration::from_secs(10));
    assert_eq!(done, [(bogus, Err(libc::EINVAL))]);
    // At most 1 MiB of debt on a 10 MiB/s bucket: the next read goes within
    // 100 ms, not after the ~7 minutes 4 GiB would take.
    let next = q.submit(&read(4096)).unwrap();
    q.kick().unwrap();
    let done = collect(q, 1, Duration::from_secs(10));
    assert_eq!(done, [(next, Ok(16 + 4096))]);
}

#[test]
fn a_detach_answers_the_waiting_requests_with_an_error_at_once() {
    let (c, mut fc, a, b, _) = two_volumes("qos-detach");
    let q = fc.request_queue(0).unwrap();
    let waiting: BTreeSet<u64> = (0..4).map(|_| q.submit(&getattr(a)).unwrap()).collect();
    q.kick().unwrap();
    wait_until_waiting(&c, "a", 4);
    c.detach("a");
    let done = collect(q, 4, Duration::from_secs(10));
    let tokens: BTreeSet<u64> = done.iter().map(|d| d.0).collect();
    assert_eq!(tokens, waiting, "{done:?}");
    for (_, r) in &done {
        let errno = r.expect_err("a request to a detached volume fails");
        assert!(
            [libc::ESTALE, libc::ENOENT, libc::EIO].contains(&errno),
            "errno {errno}"
        );
    }
    // b was never affected.
    fc.getattr(b).unwrap();
}

#[test]
fn a_new_driver_drops_the_waiting_requests_and_its_ring_gets_none_of_them() {
    let (c, mut fc, a, b, _) = two_volumes("qos-new-driver");
    let q = fc.request_queue(0).unwrap();
    for _ in 0..3 {
        q.submit(&getattr(a)).unwrap();
    }
    q.kick().unwrap();
    wait_until_waiting(&c, "a", 3);
    // A rebooted guest: its new driver sets the queue up on fresh rings.
    fc.restart_request_queue(0, 256).unwrap();
    fc.init_session(&InitParams::default()).unwrap();
    let a = fc.lookup(ROOT, "a").unwrap().nodeid;
    let b2 = fc.lookup(ROOT, "b").unwrap().nodeid;
    assert_eq!(b2, b);
    assert_eq!(c.volume("a")["qos"]["waiting_requests"], 0);
    // The old requests are gone for good: lifting the limit puts nothing of theirs
    // on the new ring, and the new driver's own requests are served.
    patch(&c, "a", Value::Null);
    fc.getattr(a).unwrap();
    fc.getattr(b).unwrap();
    let q = fc.request_queue(0).unwrap();
    let stray = collect(q, 1, Duration::from_millis(300));
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn a_paused_queue_gets_no_answer_until_it_is_started_again_on_the_same_rings() {
    let (c, mut fc, a, _, _) = two_volumes("qos-pause");
    let q = fc.request_queue(0).unwrap();
    let waiting: Vec<u64> = (0..3).map(|_| q.submit(&getattr(a)).unwrap()).collect();
    q.kick().unwrap();
    wait_until_waiting(&c, "a", 3);
    // The VM is paused (the queue stopped) and the limit lifted meanwhile: nothing
    // may be returned to a stopped ring.
    fc.pause_request_queue(0, || {
        patch(&c, "a", Value::Null);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(c.volume("a")["qos"]["waiting_requests"], 3, "{}", c.d.log());
    })
    .unwrap();
    // Resumed on the same rings: the waiting requests are answered there, in order.
    let q = fc.request_queue(0).unwrap();
    let done = collect(q, 3, Duration::from_secs(10));
    let order: Vec<u64> = done.iter().map(|d| d.0).collect();
    assert_eq!(order, waiting, "{done:?}");
    assert!(done.iter().all(|d| d.1 == Ok(16 + 104)), "{done:?}");
}

/// Sends `request` with `depth` in flight for `run`, counting completions; returns
/// (completions, seconds from the first submit to the last completion).
fn hammer(q: &mut FuseQueue, request: &Request, depth: usize, run: Duration) -> (u64, f64) {
    let start = Instant::now();
    for _ in 0..depth {
        q.submit(request).unwrap();
    }
    q.kick().unwrap();
    let mut n = 0u64;
    let mut last = start;
    while start.elapsed() < run {
        for c in q.wait_completions(Duration::from_millis(200)).unwrap() {
            c.into_reply().unwrap();
            n += 1;
            last = Instant::now();
            q.submit(request).unwrap();
        }
        q.kick().unwrap();
    }
    // The ones still in flight are collected but not counted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.in_flight() > 0 && Instant::now() < deadline {
        q.wait_completions(Duration::from_millis(200)).unwrap();
    }
    (n, last.duration_since(start).as_secs_f64())
}

#[test]
fn a_limited_volume_never_gets_more_than_its_buckets_allow() {
    let dir = TestDir::new("qos-bound");
    std::fs::create_dir_all(dir.shared().join("a")).unwrap();
    std::fs::create_dir_all(dir.shared().join("b")).unwrap();
    let c = Ctl::start_with(
        dir,
        MountGuard::default(),
        &[],
        &[
            "--num-request-queues",
            "1",
            "--allowed-dir",
            "a,ops_size=50,ops_refill_time_ms=100",
            "--allowed-dir",
            "b:ro,bw_size=65536,bw_refill_time_ms=100",
        ],
    );
    std::fs::write(c.shared().join("b/f"), vec![1u8; 1 << 20]).unwrap();
    let v = c.volume("a");
    assert_eq!(v["rate_limiter"]["ops"]["size"], 50, "{v}");
    let v = c.volume("b");
    assert_eq!(v["read_only"], true, "{v}");
    assert_eq!(v["rate_limiter"]["bandwidth"]["size"], 65536, "{v}");
    let mut fc = c.client();
    let a = fc.lookup(ROOT, "a").unwrap().nodeid;
    let b = fc.lookup(ROOT, "b").unwrap().nodeid;
    let f = fc.lookup(b, "f").unwrap().nodeid;
    let fh = fc.open(f, RDONLY).unwrap().fh;
    let q = fc.request_queue(0).unwrap();

    // 500 requests per second, after a full bucket of 50.
    let (n, secs) = hammer(q, &getattr(a), 8, Duration::from_millis(1500));
    let allowed = 50.0 + 500.0 * secs;
    eprintln!("a: {n} getattrs in {secs:.3} s; the buckets allow {allowed:.0}");
    assert!(
        (n as f64) <= allowed + 1.0,
        "{n} requests in {secs:.3} s, the buckets allow {allowed:.0}"
    );
    assert!(n > 0);

    // 640 KiB per second of 4 KiB reads, after a full bucket of 64 KiB (16 reads)
    // plus the first getattr of the file ... which costs no bytes.
    let read = Request::new(Opcode::Read, f)
        .arg(&ReadIn {
            fh,
            offset: 0,
            size: 4096,
            ..Default::default()
        })
        .reply_size(16 + 4096);
    let (n, secs) = hammer(q, &read, 8, Duration::from_millis(1500));
    let allowed = (65536.0 + 655360.0 * secs) / 4096.0;
    eprintln!("b: {n} 4 KiB reads in {secs:.3} s; the buckets allow {allowed:.0}");
    assert!(
        (n as f64) <= allowed + 1.0,
        "{n} reads in {secs:.3} s, the buckets allow {allowed:.0}"
    );
    assert!(n > 0);
    let m = c.req("GET", "/metrics", None).body;
    assert!(
        m.contains("volfsd_qos_limit_bytes_per_second{volume=\"b\"} 655360\n"),
        "{m}"
    );
    assert!(
        m.contains("volfsd_qos_limit_requests_per_second{volume=\"a\"} 500\n"),
        "{m}"
    );
}

#[test]
fn limits_are_checked_and_changed_through_the_api_and_ctl() {
    let c = Ctl::start("qos-api", &[]);
    c.mkdir("a");
    c.attach("a", "a");
    let bad = |body: Value| {
        c.req("PATCH", "/volumes/a", Some(&body.to_string()))
            .expect_error(400)
    };
    let e = bad(json!({}));
    assert!(e.contains("rate_limiter must be given"), "{e}");
    let e = bad(json!({ "rate_limiter": { "ops": { "size": 0, "refill_time_ms": 10 } } }));
    assert!(e.contains("size must be above 0"), "{e}");
    let e = bad(json!({ "rate_limiter": { "ops": { "size": 5 } } }));
    assert!(e.contains("refill_time_ms"), "{e}");
    let e = bad(json!({ "rate_limiter": { "iops": {} } }));
    assert!(e.contains("unknown field"), "{e}");
    let e = c
        .req(
            "PATCH",
            "/volumes/nope",
            Some(&json!({ "rate_limiter": null }).to_string()),
        )
        .expect_error(404);
    assert!(e.contains("nope"), "{e}");
    let e = c
        .put(
            "b",
            &json!({ "path": "a", "rate_limiter": { "bandwidth": { "size": 1, "refill_time_ms": 0 } } }),
        )
        .expect_error(400);
    assert!(e.contains("refill_time_ms must be above 0"), "{e}");

    let out = c.ctl_ok(&["limit", "a", "ops_size=100", "bw_size=1048576"]);
    assert!(out.contains("100 requests per 1000 ms"), "{out}");
    let v = c.volume("a");
    assert_eq!(v["rate_limiter"]["ops"]["size"], 100, "{v}");
    assert_eq!(v["rate_limiter"]["bandwidth"]["size"], 1 << 20, "{v}");
    let out = c.ctl_ok(&["stats", "a"]);
    assert!(
        out.contains("rate_limit:    100 requests per 1000 ms"),
        "{out}"
    );
    // An identical retry of the first attach now conflicts: its limit changed.
    let e = c.put("a", &json!({ "path": "a" })).expect_error(409);
    assert!(e.contains("other parameters"), "{e}");
    let out = c.ctl_ok(&["limit", "a", "--none"]);
    assert!(out.contains("unlimited"), "{out}");
    assert!(c.volume("a").get("rate_limiter").is_none());
    let e = c.ctl_err(&["limit", "a", "ops_speed=1"]);
    assert!(e.contains("unknown option"), "{e}");
}
