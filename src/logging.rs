//! Logging to stderr (env_logger) or to syslog (`--syslog`), behind a guard that a
//! hostile guest cannot use to flood the log:
//!
//! - records of the FUSE server and virtqueue crates (`fuse_backend_rs*`,
//!   `virtio_queue*`), which print guest payloads (a whole bad name, a whole request
//!   header) at error level, are demoted to debug: shown only with `--log-level debug`
//!   or `trace`;
//! - warnings and errors are rate-limited per call site (module and line): a burst of
//!   [`BURST`], then one per second; what was dropped is reported as
//!   "suppressed N similar messages", on the next line from that site or by a summary
//!   at most [`SUMMARY_PERIOD`] later;
//! - every line, at every level, then takes a token from one log budget for the whole
//!   daemon (one daemon serves one guest, so this is the guest's budget): [`BUDGET`]
//!   at the default levels, the larger [`DEBUG_BUDGET`] at `debug` and `trace`. A
//!   guest's INITs, new sessions, failed requests and warnings, the frontend's device
//!   resets and the control socket's attaches and detaches all share it. Past it
//!   lines are dropped and counted, and one "suppressed N log lines" summary is
//!   written per [`BUDGET_REPORT`] while they are. The per-site summaries pass
//!   through the budget too; the budget's own summary does not (it is at most one
//!   line per interval). Only the daemon's lifecycle lines ([`LIFECYCLE`]: start-up,
//!   "Waiting for vhost-user socket connection...", exit), which no guest can
//!   repeat, are exempt, so that a flood never hides them;
//! - every message is cut at [`MAX_MESSAGE`] bytes while it is formatted, so a 1 MiB
//!   `Debug` string is never built, and control characters are escaped (a guest name
//!   cannot forge a log line).
//!
//! A record below the level is never formatted. The syslog writer is a few lines over
//! `/dev/log` (RFC 3164 framing), which is all a daemon needs.
//!
//! A line written while a thread serves a volume's request carries that volume and
//! operation (`fs::readonly::with_current_request`): ` volume=NAME op=OP` at the end
//! of a text line, the fields `volume` and `op` of a JSON line (`--log-format json`:
//! one object per line, with `time`, `level`, `target`, `message`, `volume` and
//! `op`, the last two null outside a request).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Longest message written, in bytes (the line prefix and a truncation mark come on top).
pub const MAX_MESSAGE: usize = 512;
/// Warnings and errors one call site may log at once before it is rate-limited.
pub const BURST: u32 = 10;
/// Then one message per this interval per call site.
pub const REFILL: Duration = Duration::from_secs(1);
/// How soon a "suppressed N similar messages" summary follows a quiet site.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(2);
/// Call sites tracked at once (there are a few hundred in the binary; bounded anyway).
const MAX_SITES: usize = 4096;

/// The log budget at the default levels (error, warn, info). The burst covers a
/// start-up and the attach of a few dozen volumes at once without a dropped line; the
/// rate is far above what a well-behaved guest and platform cause (a few lines per
/// attach, per guest boot), and far below the 1 MB/s a guest reached without it: at
/// most 20 lines of at most ~600 bytes a second. With the burst, 30 s of flood make
/// 800 lines, well under journald's default per-unit limit (10,000 per 30 s), so a
/// flooding guest does not make journald drop the lines of other daemons of its unit.
pub const BUDGET: Budget = Budget {
    burst: 200,
    per_second: 20,
};
/// The log budget at `debug` and `trace`, which log a line per failed request: ten
/// times the default, so that an operator debugging sees a useful sample of a
/// flood; 30 s of it (8,000 lines) still stay under journald's default limit.
pub const DEBUG_BUDGET: Budget = Budget {
    burst: 2000,
    per_second: 200,
};
// Debug logs more, never less.
const _: () =
    assert!(DEBUG_BUDGET.burst >= BUDGET.burst && DEBUG_BUDGET.per_second >= BUDGET.per_second);
/// At most one "suppressed N log lines" summary of the budget per this interval.
pub const BUDGET_REPORT: Duration = Duration::from_secs(1);
/// The target of the daemon's lifecycle lines, exempt from the budget: those of
/// `daemon.rs` (their default target), and the few once-per-process lines elsewhere
/// (the control socket's start, a fatal error at exit) that name it explicitly.
/// Nothing a guest, the frontend or a control client can repeat may use it.
pub const LIFECYCLE: &str = "volfsd::daemon";

fn connect_syslog() -> std::io::Result<UnixDatagram> {
    let sock = UnixDatagram::unbound()?;
    sock.connect(SYSLOG_SOCKET)?;
    Ok(sock)
}

fn stderr_sink(format: LogFormat) -> Sink {
    let mut b = env_logger::Builder::new();
    b.filter_level(LevelFilter::Trace);
    match format {
        LogFormat::Text => b.format_timestamp_millis(),
        // The whole JSON object is the message: written as it is.
        LogFormat::Json => b.format(|buf, record| {
            use std::io::Write;
            writeln!(buf, "{}", record.args())
        }),
    };
    Sink::Stderr(b.build())
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub enum LogFormat {
    /// env_logger's lines (syslog's framing with `--syslog`).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Crates whose log records can carry guest payloads; demoted to debug.
const GUEST_PAYLOAD_TARGETS: &[&str] = &["fuse_backend_rs", "virtio_queue"];

/// The syslog socket volfsd writes to with `--syslog`.
pub const SYSLOG_SOCKET: &str = "/dev/log";

/// Sets the process logger. With `--syslog` and no syslog daemon listening on
/// [`SYSLOG_SOCKET`] (a container or a minimal host), logs go to stderr after one
/// warning, as virtiofsd does: Kata always passes `--syslog`.
pub fn init(level: LevelFilter, syslog: bool, format: LogFormat) -> Result<(), String> {
    let (sink, fallback) = if syslog {
        match connect_syslog() {
            Ok(sock) => (
                Sink::Syslog {
                    sock: Mutex::new(sock),
                    pid: std::process::id(),
                },
                None,
            ),
            Err(e) => (stderr_sink(format), Some(e)),
        }
    } else {
        (stderr_sink(format), None)
    };
    let logger = Arc::new(GuardLogger::new(level, sink).with_format(format));
    log::set_boxed_logger(Box::new(SharedLogger(logger.clone()))).map_err(|e| e.to_string())?;
    log::set_max_level(level);
    if let Some(e) = fallback {
        log::warn!(
            target: LIFECYCLE,
            "--syslog: cannot connect to {SYSLOG_SOCKET} ({e}); logging to stderr"
        );
    }
    let _ = LOGGER.set(logger);
    Ok(())
}

/// Now, as RFC 3339 UTC with milliseconds (`2026-12-02T04:05:06.789Z`).
fn rfc3339_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_millis())
}

fn rfc3339(secs: u64, millis: u32) -> String {
    // Howard Hinnant's days-to-civil.
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The logger `init` installed, for the summary thread.
static LOGGER: std::sync::OnceLock<Arc<GuardLogger>> = std::sync::OnceLock::new();

/// Starts the thread that summarises suppressed messages for sites that went quiet.
/// Separate from [`init`]: logging starts before the sandbox (it may connect to
/// /dev/log), threads only after it. The thread starts with every signal blocked (it
/// inherits the mask), so that SIGTERM/SIGINT reach the daemon's signal thread, never
/// this one.
pub fn spawn_summary_thread() -> Result<(), String> {
    let Some(logger) = LOGGER.get().cloned() else {
        return Ok(());
    };
    let all = nix::sys::signal::SigSet::all();
    let mut old = nix::sys::signal::SigSet::empty();
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&all),
        Some(&mut old),
    )
    .map_err(|e| format!("blocking signals: {e}"))?;
    let spawned = std::thread::Builder::new()
        .name("volfsd-log".to_string())
        .spawn(move || {
            crate::sandbox::confine_thread_or_exit(crate::sandbox::ThreadRole::Logger);
            loop {
                std::thread::sleep(SUMMARY_PERIOD / 2);
                logger.flush_suppressed(Instant::now());
            }
        });
    nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&old), None)
        .map_err(|e| format!("restoring the signal mask: {e}"))?;
    spawned.map_err(|e| format!("starting the log thread: {e}"))?;
    Ok(())
}

/// The level a record is logged at: guest-payload crates are demoted to debug.
pub fn effective_level(metadata: &Metadata) -> Level {
    let level = metadata.level();
    let target = metadata.target();
    if level < Level::Debug && GUEST_PAYLOAD_TARGETS.iter().any(|t| target.starts_with(t)) {
        Level::Debug
    } else {
        level
    }
}

/// Where formatted lines go.
pub enum Sink {
    Stderr(env_logger::Logger),
    Syslog {
        sock: Mutex<UnixDatagram>,
        pid: u32,
    },
    /// Collected lines (tests).
    Memory(Mutex<Vec<String>>),
}

impl Sink {
    fn write(&self, level: Level, record: &Record, msg: &str) {
        match self {
            Sink::Stderr(inner) => inner.log(
                &Record::builder()
                    .args(format_args!("{msg}"))
                    .level(level)
                    .target(record.target())
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build(),
            ),
            Sink::Syslog { sock, pid } => {
                // facility daemon (3) * 8 + severity
                let severity = match level {
                    Level::Error => 3,
                    Level::Warn => 4,
                    Level::Info => 6,
                    Level::Debug | Level::Trace => 7,
                };
                let line = format!("<{}>volfsd[{pid}]: {msg}", 3 * 8 + severity);
                let _ = sock.lock().unwrap().send(line.as_bytes());
            }
            Sink::Memory(lines) => lines.lock().unwrap().push(format!("{level} {msg}")),
        }
    }
}

/// The guard in front of the sink; see the module documentation.
pub struct GuardLogger {
    level: LevelFilter,
    sink: Sink,
    /// The per-site limiter and the budget, under one lock: a record takes it once.
    limits: Mutex<Limits>,
    format: LogFormat,
}

struct Limits {
    sites: RateLimiter,
    budget: LogBudget,
}

impl GuardLogger {
    pub fn new(level: LevelFilter, sink: Sink) -> Self {
        GuardLogger {
            level,
            sink,
            limits: Mutex::new(Limits {
                sites: RateLimiter::default(),
                budget: LogBudget::new(Budget::for_level(level), Instant::now()),
            }),
            format: LogFormat::Text,
        }
    }

    pub fn with_format(mut self, format: LogFormat) -> Self {
        self.format = format;
        self
    }

    /// With another budget (tests).
    pub fn with_budget(self, budget: Budget, now: Instant) -> Self {
        self.limits.lock().unwrap().budget = LogBudget::new(budget, now);
        self
    }

    /// The line for `msg`: with the request's volume and operation, in the format.
    fn line<'m>(&self, level: Level, target: &str, msg: &'m str) -> Cow<'m, str> {
        crate::fs::readonly::with_current_request(|request| match self.format {
            LogFormat::Text => match request {
                Some((volume, op)) => format!("{msg} volume={volume} op={op}").into(),
                None => msg.into(),
            },
            LogFormat::Json => {
                let mut obj = serde_json::Map::new();
                obj.insert("time".into(), rfc3339_now().into());
                obj.insert("level".into(), level.as_str().into());
                obj.insert("target".into(), target.into());
                obj.insert("message".into(), msg.into());
                // Every line has both fields: null outside a volume's request.
                let (volume, op) = request.unzip();
                obj.insert("volume".into(), volume.into());
                obj.insert("op".into(), op.into());
                serde_json::Value::Object(obj).to_string().into()
            }
        })
    }

    /// The lines written so far, for a [`Sink::Memory`] logger.
    pub fn lines(&self) -> Vec<String> {
        match &self.sink {
            Sink::Memory(lines) => lines.lock().unwrap().clone(),
            _ => Vec::new(),
        }
    }

    fn log_at(&self, record: &Record, now: Instant) {
        let level = effective_level(record.metadata());
        if level > self.level {
            return;
        }
        let mut suffix = None;
        {
            let mut limits = self.limits.lock().unwrap();
            if level <= Level::Warn {
                let site = Site {
                    module: record.module_path().unwrap_or(record.target()),
                    line: record.line().unwrap_or(0),
                };
                match limits.sites.admit(&site, now) {
                    Admit::Drop => return,
                    Admit::Emit { suppressed } => suffix = (suppressed > 0).then_some(suppressed),
                }
            }
            // Refused, the line counts as dropped, and so do the site's messages its
            // suffix would have reported.
            if record.target() != LIFECYCLE && !limits.budget.admit(now, 1 + suffix.unwrap_or(0)) {
                return;
            }
        }
        let mut msg = Bounded::new();
        let _ = fmt::write(&mut msg, *record.args());
        if msg.truncated {
            msg.push_mark(" [truncated]");
        }
        if let Some(n) = suffix {
            let _ = write!(msg.mark(), " [suppressed {n} similar messages]");
        }
        let line = self.line(level, record.target(), msg.as_str());
        self.sink.write(level, record, &line);
    }

    /// Reports sites that dropped messages and have been quiet since (within the
    /// budget), then what the budget dropped, if anything, at most once per
    /// [`BUDGET_REPORT`].
    pub fn flush_suppressed(&self, now: Instant) {
        let (pending, budget_dropped, budget) = {
            let mut limits = self.limits.lock().unwrap();
            let mut pending = limits.sites.take_quiet(now);
            // A refused summary's messages are counted by the budget's instead.
            pending.retain(|&(_, _, n)| limits.budget.admit(now, n));
            (
                pending,
                limits.budget.take_report(now),
                limits.budget.budget,
            )
        };
        for (module, line, n) in pending {
            self.write_summary(&format!("{module}:{line}: suppressed {n} similar messages"));
        }
        if let Some(n) = budget_dropped {
            self.write_summary(&format!(
                "suppressed {n} log lines over the log budget ({} at once, then {} a second)",
                budget.burst, budget.per_second
            ));
        }
    }

    fn write_summary(&self, text: &str) {
        let text = self.line(Level::Warn, module_path!(), text);
        self.sink.write(
            Level::Warn,
            &Record::builder()
                .args(format_args!("{text}"))
                .level(Level::Warn)
                .target(module_path!())
                .module_path(Some(module_path!()))
                .build(),
            &text,
        );
    }
}

impl Log for GuardLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        effective_level(metadata) <= self.level
    }

    fn log(&self, record: &Record) {
        self.log_at(record, Instant::now());
    }

    fn flush(&self) {
        if let Sink::Stderr(inner) = &self.sink {
            inner.flush();
        }
    }
}

struct SharedLogger(Arc<GuardLogger>);

impl Log for SharedLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.0.enabled(metadata)
    }
    fn log(&self, record: &Record) {
        self.0.log(record)
    }
    fn flush(&self) {
        self.0.flush()
    }
}

/// A call site: the module and line of the `log!` macro.
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    pub module: &'a str,
    pub line: u32,
}

#[derive(Debug, Eq, PartialEq)]
pub enum Admit {
    /// Log it; `suppressed` messages of this site were dropped since the last one.
    Emit {
        suppressed: u64,
    },
    Drop,
}

struct SiteState {
    module: String,
    line: u32,
    tokens: f64,
    last: Instant,
    suppressed: u64,
    last_drop: Instant,
}

/// A token bucket per call site: [`BURST`] at once, refilled at one per [`REFILL`].
#[derive(Default)]
pub struct RateLimiter {
    sites: HashMap<u64, SiteState>,
}

impl RateLimiter {
    pub fn admit(&mut self, site: &Site, now: Instant) -> Admit {
        if self.sites.len() >= MAX_SITES && !self.sites.contains_key(&key_ref(site)) {
            // Forget sites with nothing pending; a real binary never gets here.
            self.sites.retain(|_, s| s.suppressed > 0);
        }
        let s = self
            .sites
            .entry(key_ref(site))
            .or_insert_with(|| SiteState {
                module: site.module.to_string(),
                line: site.line,
                tokens: f64::from(BURST),
                last: now,
                suppressed: 0,
                last_drop: now,
            });
        let refill = now.saturating_duration_since(s.last).as_secs_f64() / REFILL.as_secs_f64();
        s.tokens = (s.tokens + refill).min(f64::from(BURST));
        s.last = now;
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            let suppressed = std::mem::take(&mut s.suppressed);
            Admit::Emit { suppressed }
        } else {
            s.suppressed += 1;
            s.last_drop = now;
            Admit::Drop
        }
    }

    /// Sites that dropped messages and dropped none for [`SUMMARY_PERIOD`]: their
    /// counts, reset to zero.
    pub fn take_quiet(&mut self, now: Instant) -> Vec<(String, u32, u64)> {
        let mut out = Vec::new();
        for s in self.sites.values_mut() {
            if s.suppressed > 0 && now.saturating_duration_since(s.last_drop) >= SUMMARY_PERIOD {
                out.push((s.module.clone(), s.line, std::mem::take(&mut s.suppressed)));
            }
        }
        out
    }
}

/// A log budget: lines at once, then lines a second.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Budget {
    pub burst: u32,
    pub per_second: u32,
}

impl Budget {
    /// [`DEBUG_BUDGET`] at `debug` and `trace`, else [`BUDGET`].
    pub fn for_level(level: LevelFilter) -> Budget {
        if level >= LevelFilter::Debug {
            DEBUG_BUDGET
        } else {
            BUDGET
        }
    }
}

/// One token bucket for every line the daemon writes (but [`LIFECYCLE`]'s), with the
/// count of the lines it refused.
pub struct LogBudget {
    budget: Budget,
    tokens: f64,
    last: Instant,
    dropped: u64,
    last_report: Option<Instant>,
}

impl LogBudget {
    /// Full at `now`.
    pub fn new(budget: Budget, now: Instant) -> Self {
        LogBudget {
            budget,
            tokens: f64::from(budget.burst),
            last: now,
            dropped: 0,
            last_report: None,
        }
    }

    /// Takes a token for one line. Without one, false, and `weight` lines (the line
    /// and any it stood for) are counted as dropped.
    pub fn admit(&mut self, now: Instant, weight: u64) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(self.budget.per_second))
            .min(f64::from(self.budget.burst));
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += weight;
            false
        }
    }

    /// The lines dropped since the last report, reset to zero: None when there are
    /// none, or when the last report is less than [`BUDGET_REPORT`] old.
    pub fn take_report(&mut self, now: Instant) -> Option<u64> {
        if self.dropped == 0
            || self
                .last_report
                .is_some_and(|t| now.saturating_duration_since(t) < BUDGET_REPORT)
        {
            return None;
        }
        self.last_report = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

/// No allocation per record: sites are keyed by a hash of module and line.
fn key_ref(site: &Site) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    site.module.hash(&mut h);
    site.line.hash(&mut h);
    h.finish()
}

/// A message buffer that keeps at most [`MAX_MESSAGE`] bytes and then makes the
/// formatter stop (a `fmt::Error` ends `fmt::write` early), escaping control
/// characters on the way.
pub struct Bounded {
    buf: String,
    limit: usize,
    pub truncated: bool,
}

impl Default for Bounded {
    fn default() -> Self {
        Self::new()
    }
}

impl Bounded {
    pub fn new() -> Self {
        Self::with_limit(MAX_MESSAGE)
    }

    pub fn with_limit(limit: usize) -> Self {
        Bounded {
            buf: String::with_capacity(limit.min(1024)),
            limit,
            truncated: false,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.buf
    }

    fn push_mark(&mut self, s: &str) {
        self.buf.push_str(s);
    }

    /// Appends past the limit (for the suffixes the logger adds itself).
    fn mark(&mut self) -> &mut String {
        &mut self.buf
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.truncated {
            return Err(fmt::Error);
        }
        for c in s.chars() {
            let escaped;
            let piece: &str = if c.is_control() && c != '\t' {
                escaped = c.escape_default().to_string();
                &escaped
            } else {
                let mut tmp = [0u8; 4];
                let len = c.encode_utf8(&mut tmp).len();
                if self.buf.len() + len > self.limit {
                    self.truncated = true;
                    return Err(fmt::Error);
                }
                self.buf.push(c);
                continue;
            };
            if self.buf.len() + piece.len() > self.limit {
                self.truncated = true;
                return Err(fmt::Error);
            }
            self.buf.push_str(piece);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_184_306, 789), "2026-12-02T04:05:06.789Z");
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
}
