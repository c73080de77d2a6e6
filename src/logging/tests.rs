//! The guard's tests: formats, the limits, the budget, bounded messages.
use super::*;

fn site(line: u32) -> Site<'static> {
    Site {
        module: "volfsd::device::queue",
        line,
    }
}

#[test]
fn json_lines_are_one_object_each_with_the_fields() {
    let logger = GuardLogger::new(LevelFilter::Info, Sink::Memory(Mutex::new(Vec::new())))
        .with_format(LogFormat::Json);
    logger.log(
        &Record::builder()
            .args(format_args!("a \"quoted\" name\nand a newline"))
            .level(Level::Warn)
            .target("volfsd::fs::volumes")
            .module_path(Some("volfsd::fs::volumes"))
            .line(Some(7))
            .build(),
    );
    let lines = logger.lines();
    assert_eq!(lines.len(), 1);
    let json = lines[0].strip_prefix("WARN ").unwrap();
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["level"], "WARN");
    assert_eq!(v["target"], "volfsd::fs::volumes");
    // The guard escaped the newline before the JSON encoding: one line.
    assert_eq!(v["message"], "a \"quoted\" name\\nand a newline");
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
    assert!(
        v["volume"].is_null() && v["op"].is_null(),
        "no request: {json}"
    );
    assert!(!json.contains('\n'));
}

#[test]
fn rfc3339_dates() {
    let at = |secs: i64, millis: i32| {
        format!(
            "{:.3}",
            jiff::Timestamp::new(secs, millis * 1_000_000).unwrap()
        )
    };
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
    assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
    assert_eq!(at(1_796_184_306, 789), "2026-12-02T04:05:06.789Z");
    let now = rfc3339_now();
    assert!(now.len() == 24 && now.ends_with('Z'), "{now}");
}

#[test]
fn burst_then_one_per_second_with_a_suppressed_count() {
    let mut rl = RateLimiter::default();
    let t0 = Instant::now();
    for _ in 0..BURST {
        assert_eq!(rl.admit(&site(1), t0), Admit::Emit { suppressed: 0 });
    }
    for _ in 0..1000 {
        assert_eq!(rl.admit(&site(1), t0), Admit::Drop);
    }
    // Another site has its own bucket.
    assert_eq!(rl.admit(&site(2), t0), Admit::Emit { suppressed: 0 });
    // Half a second later: still nothing; one second later: one, with the count.
    let t = t0 + Duration::from_millis(500);
    assert_eq!(rl.admit(&site(1), t), Admit::Drop);
    let t = t0 + Duration::from_millis(1000);
    assert_eq!(rl.admit(&site(1), t), Admit::Emit { suppressed: 1001 });
    assert_eq!(rl.admit(&site(1), t), Admit::Drop);
    // Bounded over a long flood: about one per second.
    let mut emitted = 0;
    for ms in 0..10_000u64 {
        let t = t + Duration::from_millis(ms);
        if matches!(rl.admit(&site(1), t), Admit::Emit { .. }) {
            emitted += 1;
        }
    }
    assert!((9..=11).contains(&emitted), "{emitted}");
}

#[test]
fn quiet_sites_get_a_summary_once() {
    let mut rl = RateLimiter::default();
    let t0 = Instant::now();
    for _ in 0..BURST + 5 {
        rl.admit(&site(7), t0);
    }
    assert!(rl.take_quiet(t0).is_empty(), "not quiet yet");
    let later = t0 + SUMMARY_PERIOD;
    assert_eq!(
        rl.take_quiet(later),
        vec![("volfsd::device::queue".to_string(), 7, 5)]
    );
    assert!(rl.take_quiet(later).is_empty(), "reported once");
}

fn info_line(logger: &GuardLogger, target: &str, line: u32, now: Instant) {
    logger.log_at(
        &Record::builder()
            .args(format_args!("new guest session: released 0 node ids"))
            .level(Level::Info)
            .target(target)
            .module_path(Some(target))
            .line(Some(line))
            .build(),
        now,
    );
}

#[test]
fn the_budget_gives_its_burst_then_its_rate_and_counts_the_rest() {
    let t0 = Instant::now();
    let mut b = LogBudget::new(BUDGET, t0);
    for _ in 0..BUDGET.burst {
        assert!(b.admit(t0, 1));
    }
    for _ in 0..1000 {
        assert!(!b.admit(t0, 1));
    }
    // A refused line that stood for 4 others counts 5.
    assert!(!b.admit(t0, 5));
    // A second later: per_second more, no more.
    let t1 = t0 + Duration::from_secs(1);
    let admitted = (0..1000).filter(|_| b.admit(t1, 1)).count();
    assert_eq!(admitted, BUDGET.per_second as usize);
    assert_eq!(b.take_report(t1), Some(1005 + 1000 - 20));
    // Reported once; nothing more to report until something is dropped again,
    // and then not before BUDGET_REPORT has passed.
    assert_eq!(b.take_report(t1), None);
    assert!(!b.admit(t1, 1));
    assert_eq!(b.take_report(t1 + BUDGET_REPORT / 2), None);
    assert_eq!(b.take_report(t1 + BUDGET_REPORT), Some(1));
    // A long flood at one line a millisecond: the burst refills to no more than
    // itself, then per_second a second.
    let t2 = t1 + Duration::from_secs(3600);
    let admitted = (0..10_000u64)
        .filter(|&ms| b.admit(t2 + Duration::from_millis(ms), 1))
        .count() as u64;
    let bound = u64::from(BUDGET.burst) + 10 * u64::from(BUDGET.per_second);
    assert!(
        (bound - 2..=bound).contains(&admitted),
        "{admitted} of a bound of {bound}"
    );
    // A clock read before the last one adds nothing.
    let mut b = LogBudget::new(
        Budget {
            burst: 1,
            per_second: 1,
        },
        t1,
    );
    assert!(b.admit(t1, 1));
    assert!(!b.admit(t0, 1));
}

#[test]
fn debug_levels_get_the_larger_budget() {
    assert_eq!(Budget::for_level(LevelFilter::Info), BUDGET);
    assert_eq!(Budget::for_level(LevelFilter::Error), BUDGET);
    assert_eq!(Budget::for_level(LevelFilter::Debug), DEBUG_BUDGET);
    assert_eq!(Budget::for_level(LevelFilter::Trace), DEBUG_BUDGET);
}

#[test]
fn info_lines_share_the_budget_and_lifecycle_lines_pass_it() {
    let t0 = Instant::now();
    let logger = GuardLogger::new(LevelFilter::Info, Sink::Memory(Mutex::new(Vec::new())))
        .with_budget(
            Budget {
                burst: 5,
                per_second: 1,
            },
            t0,
        );
    // Two guest-caused call sites at info (INIT and new session) flood together.
    for _ in 0..100 {
        info_line(&logger, "volfsd::fs::init", 93, t0);
        info_line(&logger, "volfsd::fs::volumes", 464, t0);
    }
    assert_eq!(logger.lines().len(), 5, "{:?}", logger.lines());
    // The daemon's own lifecycle lines are never hidden by it.
    info_line(&logger, LIFECYCLE, 1, t0);
    assert_eq!(logger.lines().len(), 6);
    assert!(logger.lines()[5].contains("new guest session"));
    // One summary with everything dropped, then none while nothing is.
    logger.flush_suppressed(t0);
    let lines = logger.lines();
    assert_eq!(lines.len(), 7);
    assert!(
        lines[6].starts_with("WARN suppressed 195 log lines over the log budget"),
        "{}",
        lines[6]
    );
    logger.flush_suppressed(t0 + BUDGET_REPORT);
    assert_eq!(logger.lines().len(), 7);
}

#[test]
fn warnings_pass_their_site_and_then_the_budget_and_nothing_goes_uncounted() {
    let t0 = Instant::now();
    let logger = GuardLogger::new(LevelFilter::Info, Sink::Memory(Mutex::new(Vec::new())))
        .with_budget(
            Budget {
                burst: 15,
                per_second: 1,
            },
            t0,
        );
    let warn = |line: u32, now: Instant| {
        logger.log_at(
            &Record::builder()
                .args(format_args!("queue 0: more than 64 lock waits"))
                .level(Level::Warn)
                .target("volfsd::device::queue")
                .module_path(Some("volfsd::device::queue"))
                .line(Some(line))
                .build(),
            now,
        )
    };
    // Three sites, 50 warnings each: each site passes BURST (10), the budget
    // only 15 of those 30.
    for _ in 0..50 {
        for line in 1..=3 {
            warn(line, t0);
        }
    }
    assert_eq!(logger.lines().len(), 15);
    // The sites' summaries come once they are quiet, through the budget: its
    // tokens came back meanwhile (1 a second), so 2 of 3 pass.
    let later = t0 + SUMMARY_PERIOD;
    logger.flush_suppressed(later);
    let lines = logger.lines();
    let summaries: Vec<&String> = lines[15..]
        .iter()
        .filter(|l| l.contains("similar messages"))
        .collect();
    assert_eq!(summaries.len(), 2, "{lines:?}");
    let report = lines.last().unwrap();
    // 15 warnings the budget refused and the 40 of the refused site summary.
    assert!(
        report.contains("suppressed 55 log lines over the log budget"),
        "{report}"
    );
    // Every one of the 150 warnings is written or counted, once.
    let counted = |l: &String| -> u64 {
        let n = l.split("suppressed ").nth(1).unwrap();
        n.split(' ').next().unwrap().parse().unwrap()
    };
    let written = 15;
    let reported: u64 = summaries.iter().map(|l| counted(l)).sum::<u64>() + counted(report);
    assert_eq!(written + reported, 150, "{lines:?}");
}

#[test]
fn a_huge_debug_string_is_cut_without_being_built() {
    struct Counting<'a>(&'a std::cell::Cell<usize>);
    impl fmt::Debug for Counting<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            for _ in 0..(1 << 20) {
                self.0.set(self.0.get() + 1);
                f.write_str("97, ")?;
            }
            Ok(())
        }
    }
    let calls = std::cell::Cell::new(0);
    let mut b = Bounded::new();
    let r = write!(b, "fuse: bytes to cstr error: {:?}", Counting(&calls));
    assert!(r.is_err());
    assert!(b.truncated);
    assert!(b.as_str().len() <= MAX_MESSAGE);
    assert!(calls.get() < 200, "formatting went on: {}", calls.get());
    // A whole 1 MiB Vec<u8> Debug stops just as early.
    let name = vec![b'a'; 1 << 20];
    let mut b = Bounded::new();
    let _ = write!(b, "{name:?}");
    assert!(b.truncated && b.as_str().len() <= MAX_MESSAGE);
}

#[test]
fn multibyte_and_control_characters() {
    let mut b = Bounded::with_limit(5);
    let _ = write!(b, "ééé");
    assert_eq!(b.as_str(), "éé");
    assert!(b.truncated);
    let mut b = Bounded::new();
    let _ = write!(b, "a\nforged line\r\x1b[31m\tok");
    assert_eq!(b.as_str(), "a\\nforged line\\r\\u{1b}[31m\tok");
    assert!(!b.truncated);
}

#[test]
fn guest_payload_crates_are_debug_only_and_others_rate_limited() {
    let logger = GuardLogger::new(LevelFilter::Info, Sink::Memory(Mutex::new(Vec::new())));
    let meta =
        |target: &'static str, level| Metadata::builder().target(target).level(level).build();
    assert!(!logger.enabled(&meta("fuse_backend_rs::api::server::sync_io", Level::Error)));
    assert!(!logger.enabled(&meta("virtio_queue::queue", Level::Error)));
    assert!(logger.enabled(&meta("volfsd::device::queue", Level::Warn)));
    let now = Instant::now();
    let big = vec![b'x'; 1 << 20];
    for _ in 0..100 {
        logger.log_at(
            &Record::builder()
                .args(format_args!("fuse: bytes to cstr error: {big:?}"))
                .level(Level::Error)
                .target("fuse_backend_rs::api::server::sync_io")
                .build(),
            now,
        );
    }
    assert!(logger.lines().is_empty(), "{:?}", logger.lines().len());
    for _ in 0..100 {
        logger.log_at(
            &Record::builder()
                .args(format_args!("queue 1: bad chain {big:?}"))
                .level(Level::Warn)
                .target("volfsd::device::queue")
                .module_path(Some("volfsd::device::queue"))
                .line(Some(161))
                .build(),
            now,
        );
    }
    let lines = logger.lines();
    assert_eq!(lines.len(), BURST as usize);
    assert!(
        lines.iter().all(|l| l.len() < MAX_MESSAGE + 64),
        "{lines:?}"
    );
    logger.flush_suppressed(now + SUMMARY_PERIOD);
    let last = logger.lines().pop().unwrap();
    assert!(last.contains("suppressed 90 similar messages"), "{last}");
    // At debug level the demoted records show, cut to size.
    let logger = GuardLogger::new(LevelFilter::Debug, Sink::Memory(Mutex::new(Vec::new())));
    logger.log_at(
        &Record::builder()
            .args(format_args!("fuse: bytes to cstr error: {big:?}"))
            .level(Level::Error)
            .target("fuse_backend_rs::api::server::sync_io")
            .build(),
        now,
    );
    let lines = logger.lines();
    assert_eq!(lines.len(), 1);
    assert!(lines[0].starts_with("DEBUG fuse: bytes"), "{}", lines[0]);
    assert!(lines[0].ends_with("[truncated]"));
}

/// The summary thread sleeps without a timer until a message is dropped (an idle
/// daemon never wakes it), reports while there is something to report, and sleeps
/// again once everything is reported.
#[test]
fn the_summary_thread_wakes_only_while_something_was_dropped() {
    use std::sync::atomic::Ordering::Relaxed;
    let logger = Arc::new(GuardLogger::new(
        LevelFilter::Info,
        Sink::Memory(Mutex::new(Vec::new())),
    ));
    spawn_summaries(logger.clone(), |job| {
        std::thread::spawn(job);
        Ok(())
    })
    .unwrap();
    let warn = || {
        logger.log(
            &Record::builder()
                .args(format_args!("queue 0: a bad descriptor"))
                .level(Level::Warn)
                .target("volfsd::device::queue")
                .module_path(Some("volfsd::device::queue"))
                .line(Some(42))
                .build(),
        )
    };
    let asleep = || logger.limits.lock().unwrap().summaries_asleep;
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + 4 * SUMMARY_PERIOD;
        while !done() {
            assert!(Instant::now() < deadline, "{what}: {:?}", logger.lines());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait("the thread goes to sleep", &|| asleep());
    std::thread::sleep(SUMMARY_PERIOD * 3 / 4);
    assert_eq!(logger.summary_ticks.load(Relaxed), 0, "no timed wake-up");
    // Lines that pass wake nothing.
    for _ in 0..BURST {
        warn();
    }
    assert!(asleep());
    // A dropped one does; its summary follows once the site is quiet.
    warn();
    assert!(!asleep(), "the first drop wakes it");
    wait("the summary", &|| {
        logger
            .lines()
            .iter()
            .any(|l| l.contains("suppressed 1 similar messages"))
    });
    wait("asleep again", &|| asleep());
    let ticks = logger.summary_ticks.load(Relaxed);
    assert!((2..=4).contains(&ticks), "{ticks} wake-ups");
    std::thread::sleep(SUMMARY_PERIOD * 3 / 4);
    assert_eq!(logger.summary_ticks.load(Relaxed), ticks, "none since");
}
