//! `GET /metrics` against known traffic: the text is parsed by a real Prometheus
//! parser (the Python `prometheus-client` package's, which tests/install-deps.sh
//! installs), and its values must be the traffic the test sent.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;
use volfsd_harness::fixtures::control::Ctl;
use volfsd_harness::fixtures::{RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::FuseOps;

/// Parses Prometheus text with prometheus_client's parser; returns every sample as
/// (name, labels, value). Panics if the parser refuses the text.
fn parse(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append([s.name, s.labels, s.value])
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (tests/install-deps.sh installs prometheus-client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    samples
        .into_iter()
        .map(|s| {
            let labels = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (
                s[0].as_str().unwrap().to_string(),
                labels,
                s[2].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The value of the sample `name` whose labels include `want`.
fn value(
    samples: &[(String, BTreeMap<String, String>, f64)],
    name: &str,
    want: &[(&str, &str)],
) -> f64 {
    let found: Vec<f64> = samples
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
        .collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0]
}

#[test]
fn metrics_count_known_traffic_and_parse_as_prometheus_text() {
    let c = Ctl::start("metrics", &[]);
    c.mkdir("data");
    c.mkdir("ro");
    c.attach("data", "data");
    // ro is rate-limited far above this test's traffic: its limit gauges show.
    c.put(
        "ro",
        &serde_json::json!({
            "path": "ro",
            "read_only": true,
            "rate_limiter": {
                "ops": { "size": 100000, "refill_time_ms": 1000 },
                "bandwidth": { "size": 1048576, "refill_time_ms": 100 }
            }
        }),
    )
    .expect(201);
    std::fs::write(c.shared().join("data/f"), vec![5u8; 8192]).unwrap();
    let mut fc = c.client();
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    let ro = fc.lookup(ROOT, "ro").unwrap().nodeid;
    for _ in 0..5 {
        fc.lookup(data, "f").unwrap();
    }
    for _ in 0..3 {
        assert!(fc.lookup(data, "missing").is_err());
    }
    let f = fc.lookup(data, "f").unwrap().nodeid;
    let fh = fc.open(f, RDONLY).unwrap().fh;
    assert_eq!(fc.read(f, fh, 0, 4096).unwrap().len(), 4096);
    assert_eq!(fc.read(f, fh, 4096, 4096).unwrap().len(), 4096);
    let (g, gopen) = fc.create(data, "g", RDWR, 0o644).unwrap();
    assert_eq!(fc.write(g.nodeid, gopen.fh, 0, &[1u8; 100]).unwrap(), 100);
    assert!(
        fc.mkdir(ro, "nope", 0o755).is_err(),
        "EROFS on the read-only volume"
    );

    let r = c.req("GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let samples = parse(&r.body);
    let requests = |vol, op, result| {
        value(
            &samples,
            "volfsd_requests_total",
            &[("volume", vol), ("op", op), ("result", result)],
        )
    };
    // The six successful lookups of f (the volume roots are looked up in the virtual
    // root, which belongs to no volume), three ENOENT.
    assert_eq!(requests("data", "lookup", "ok"), 6.0);
    assert_eq!(requests("data", "lookup", "error"), 3.0);
    assert_eq!(requests("data", "read", "ok"), 2.0);
    assert_eq!(requests("data", "create", "ok"), 1.0);
    assert_eq!(requests("data", "write", "ok"), 1.0);
    assert_eq!(requests("ro", "mkdir", "error"), 1.0);
    let per_volume = |name, vol| value(&samples, name, &[("volume", vol)]);
    assert_eq!(
        per_volume("volfsd_qos_limit_requests_per_second", "ro"),
        100000.0
    );
    assert_eq!(
        per_volume("volfsd_qos_limit_bytes_per_second", "ro"),
        10485760.0
    );
    for vol in ["data", "ro"] {
        assert_eq!(per_volume("volfsd_qos_throttled_requests_total", vol), 0.0);
        assert_eq!(per_volume("volfsd_qos_waiting_requests", vol), 0.0);
        assert_eq!(per_volume("volfsd_qos_wait_seconds_total", vol), 0.0);
    }
    assert!(
        !samples
            .iter()
            .any(|(n, l, _)| n == "volfsd_qos_limit_requests_per_second" && l["volume"] == "data"),
        "an unlimited volume has no limit gauge"
    );
    let errno = |vol, e| {
        value(
            &samples,
            "volfsd_request_errors_total",
            &[("volume", vol), ("errno", e)],
        )
    };
    assert_eq!(errno("data", "ENOENT"), 3.0);
    assert_eq!(errno("ro", "EROFS"), 1.0);
    assert_eq!(
        value(&samples, "volfsd_read_bytes_total", &[("volume", "data")]),
        8192.0
    );
    assert_eq!(
        value(
            &samples,
            "volfsd_written_bytes_total",
            &[("volume", "data")]
        ),
        100.0
    );
    // The histogram counts every request of its operation, ok or not, and its +Inf
    // bucket is its count.
    let hist = |suffix: &str, extra: &[(&str, &str)]| {
        let mut labels = vec![("volume", "data"), ("op", "lookup")];
        labels.extend_from_slice(extra);
        value(
            &samples,
            &format!("volfsd_request_duration_seconds{suffix}"),
            &labels,
        )
    };
    assert_eq!(hist("_count", &[]), 9.0);
    assert_eq!(hist("_bucket", &[("le", "+Inf")]), 9.0);
    assert!(hist("_sum", &[]) > 0.0);
    assert!(hist("_bucket", &[("le", "0.00001")]) <= hist("_bucket", &[("le", "10")]));
    // Gauges.
    assert_eq!(value(&samples, "volfsd_volumes_attached", &[]), 2.0);
    assert_eq!(
        value(
            &samples,
            "volfsd_volume_open_handles",
            &[("volume", "data")]
        ),
        2.0
    );
    assert!(value(&samples, "volfsd_volume_nodes", &[("volume", "data")]) >= 2.0);
    assert_eq!(value(&samples, "volfsd_frontend_connected", &[]), 1.0);
    assert!(value(&samples, "volfsd_process_rss_anon_bytes", &[]) > 0.0);
    assert!(value(&samples, "process_start_time_seconds", &[]) > 1.6e9);
    assert!(value(&samples, "process_cpu_seconds_total", &[]) >= 0.0);
    assert_eq!(
        value(
            &samples,
            "volfsd_queue_in_flight_requests",
            &[("queue", "1")]
        ),
        0.0
    );
    // INIT, the two volume roots, nine lookups of f or missing, open, two reads,
    // create, write, mkdir: 18 on the one request queue, none on the others.
    assert_eq!(
        value(&samples, "volfsd_queue_requests_total", &[("queue", "1")]),
        18.0
    );
    assert_eq!(
        value(&samples, "volfsd_queue_requests_total", &[("queue", "2")]),
        0.0
    );

    // `volfsd ctl metrics` prints the same document.
    let printed = c.ctl_ok(&["metrics"]);
    assert!(
        printed.contains("volfsd_requests_total{volume=\"data\",op=\"lookup\",result=\"ok\"} 6")
    );
}

/// A SETLKW that waits is one lock wait in the gauge, and leaves the queue: its
/// worker serves on (in flight 0) and counts the next request.
#[test]
fn a_waiting_lock_shows_in_the_lock_wait_gauge_not_in_flight() {
    use fuse_backend_rs::abi::fuse_abi::Opcode;
    use volfsd_harness::fixtures::requests::lock_request;
    let c = Ctl::start("metrics-locks", &[]);
    c.mkdir("data");
    c.attach("data", "data");
    let mut fc = c.client();
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    let (f, a) = fc.create(data, "f", RDWR, 0o644).unwrap();
    let b = fc.open(f.nodeid, RDWR).unwrap().fh;
    let q = fc.request_queue(0).unwrap();
    q.call(&lock_request(
        Opcode::Setlk,
        f.nodeid,
        a.fh,
        0xa,
        libc::F_WRLCK,
        false,
    ))
    .unwrap();
    q.submit(&lock_request(
        Opcode::Setlkw,
        f.nodeid,
        b,
        0xb,
        libc::F_WRLCK,
        false,
    ))
    .unwrap();
    q.kick().unwrap();
    let gauge = |name: &str, labels: &[(&str, &str)]| {
        let r = c.req("GET", "/metrics", None);
        value(&parse(&r.body), name, labels)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while gauge("volfsd_lock_waits", &[]) != 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the wait never showed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        gauge("volfsd_queue_in_flight_requests", &[("queue", "1")]),
        0.0
    );
    q.call(&lock_request(
        Opcode::Setlk,
        f.nodeid,
        a.fh,
        0xa,
        libc::F_UNLCK,
        false,
    ))
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while gauge("volfsd_lock_waits", &[]) != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the wait did not end at unlock"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn with_no_metrics_only_the_volume_totals_are_kept() {
    let c = Ctl::start("no-metrics", &["--no-metrics"]);
    c.mkdir("data");
    c.attach("data", "data");
    std::fs::write(c.shared().join("data/f"), b"x").unwrap();
    let mut fc = c.client();
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    fc.lookup(data, "f").unwrap();
    let r = c.req("GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    let samples = parse(&r.body);
    assert!(
        samples.iter().all(|s| s.0 != "volfsd_requests_total"),
        "{samples:?}"
    );
    assert_eq!(value(&samples, "volfsd_volumes_attached", &[]), 1.0);
    assert_eq!(c.volume("data")["stats"]["ops"], 1);
}

/// A daemon at debug level with volume `data`, after one failed lookup in it.
fn after_a_failed_lookup(test: &str, extra: &[&str]) -> Ctl {
    let mut args = vec!["--log-level=debug"];
    args.extend_from_slice(extra);
    let c = Ctl::start(test, &args);
    c.mkdir("data");
    c.attach("data", "data");
    let mut fc = c.client();
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    assert!(fc.lookup(data, "missing").is_err());
    drop(fc);
    c
}

#[test]
fn json_log_lines_name_the_volume_and_operation_of_their_request() {
    let c = after_a_failed_lookup("json-logs", &["--log-format=json"]);
    assert!(c.d.log().contains("lookup failed"), "{}", c.d.log());
    let mut request_lines = 0;
    for line in c.d.log().lines() {
        // The daemon's own lines: every one is a JSON object (the supervisor of the
        // namespace sandbox writes none of its own here).
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for field in ["time", "level", "target", "message", "volume", "op"] {
            assert!(v.get(field).is_some(), "{field} missing: {line}");
        }
        if v["message"].as_str().unwrap().starts_with("lookup failed") {
            assert_eq!(v["volume"], "data", "{line}");
            assert_eq!(v["op"], "lookup", "{line}");
            assert_eq!(v["level"], "DEBUG", "{line}");
            request_lines += 1;
        } else if v["message"].as_str().unwrap().starts_with("serving ") {
            assert!(v["volume"].is_null(), "no request at start-up: {line}");
        }
    }
    assert_eq!(request_lines, 1, "{}", c.d.log());
}

#[test]
fn text_log_lines_end_with_the_volume_and_operation_of_their_request() {
    let c = after_a_failed_lookup("text-logs", &[]);
    let log = c.d.log();
    let line = log
        .lines()
        .find(|l| l.contains("lookup failed"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.ends_with(" volume=data op=lookup"), "{line}");
}
