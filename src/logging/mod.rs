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
//! operation (from the [`RequestContext`] the file-system stack registers, so that
//! this module depends on no layer of it): ` volume=NAME op=OP` at the end
//! of a text line, the fields `volume` and `op` of a JSON line (`--log-format json`:
//! one object per line, with `time`, `level`, `target`, `message`, `volume` and
//! `op`, the last two null outside a request).

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{Level, LevelFilter, Log, Metadata, Record};

mod bounded;
mod limits;
pub mod panic;
#[cfg(test)]
mod tests;

pub use bounded::Bounded;
pub use limits::{Admit, Budget, LogBudget, RateLimiter, Site};

/// A request's volume and operation, as a log line shows them.
pub type RequestFields<'a> = Option<(&'a str, &'static str)>;

/// Takes what a line wants from its request.
pub type RequestSink<'s> = dyn FnMut(RequestFields<'_>) + 's;

/// Calls its argument with the volume and operation of the request the calling
/// thread serves, if any.
pub type RequestContext = fn(&mut RequestSink<'_>);

static REQUEST_CONTEXT: std::sync::OnceLock<RequestContext> = std::sync::OnceLock::new();

/// Registers where log lines find their request's volume and operation (once; the
/// file-system stack does it when it is built).
pub fn set_request_context(context: RequestContext) {
    let _ = REQUEST_CONTEXT.set(context);
}

/// `f` with the calling thread's request, or None outside one (or before a
/// context is registered).
fn with_request<R>(f: impl FnOnce(Option<(&str, &'static str)>) -> R) -> R {
    let Some(context) = REQUEST_CONTEXT.get() else {
        return f(None);
    };
    let mut f = Some(f);
    let mut out = None;
    context(&mut |request| {
        if let Some(f) = f.take() {
            out = Some(f(request));
        }
    });
    match out {
        Some(out) => out,
        // A context that never called back: a line without the fields.
        None => (f.take().expect("called at most once"))(None),
    }
}

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
/// `daemon/mod.rs` (their default target), and the few once-per-process lines elsewhere
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
pub fn init(level: LevelFilter, syslog: bool, format: LogFormat) -> Result<(), LogError> {
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
    log::set_boxed_logger(Box::new(SharedLogger(logger.clone()))).map_err(LogError::SetLogger)?;
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

/// What setting up the log failed at.
#[derive(Debug)]
pub enum LogError {
    /// A logger was set already (only in a process that sets up logging twice).
    SetLogger(log::SetLoggerError),
    /// A step of starting the summary thread failed.
    Host {
        step: &'static str,
        source: crate::error::HostError,
    },
}

impl LogError {
    fn host(step: &'static str, source: impl Into<crate::error::HostError>) -> LogError {
        LogError::Host {
            step,
            source: source.into(),
        }
    }
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::SetLogger(e) => write!(f, "{e}"),
            LogError::Host { step, source } => write!(f, "{step}: {source}"),
        }
    }
}

impl std::error::Error for LogError {}

/// Now, as RFC 3339 UTC with milliseconds (`2026-12-02T04:05:06.789Z`).
fn rfc3339_now() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

/// The logger `init` installed, for the summary thread.
static LOGGER: std::sync::OnceLock<Arc<GuardLogger>> = std::sync::OnceLock::new();

/// Starts the thread that summarises suppressed messages for sites that went quiet,
/// and what the budget dropped. It sleeps until a message is dropped (an idle daemon
/// has no thread that wakes on a timer), then reports every [`SUMMARY_PERIOD`] / 2 while anything is left to report, and sleeps
/// again. Separate from [`init`]: logging starts before the sandbox (it may connect to
/// /dev/log), threads only after it. `spawn` starts the thread, as the daemon starts
/// every thread (confined for its role; logging knows no sandbox, which logs through
/// it); the thread blocks every signal first, so that signals reach the threads that
/// wait for them, never this one.
pub fn spawn_summary_thread(
    spawn: impl FnOnce(Box<dyn FnOnce() + Send>) -> std::io::Result<()>,
) -> Result<(), LogError> {
    match LOGGER.get().cloned() {
        Some(logger) => spawn_summaries(logger, spawn),
        None => Ok(()),
    }
}

/// [`spawn_summary_thread`] for a given logger: `spawn` starts the thread (confined
/// for its role, and returning once it is), which takes no signal.
fn spawn_summaries(
    logger: Arc<GuardLogger>,
    spawn: impl FnOnce(Box<dyn FnOnce() + Send>) -> std::io::Result<()>,
) -> Result<(), LogError> {
    spawn(Box::new(move || {
        let all = nix::sys::signal::SigSet::all();
        let _ = nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_BLOCK,
            Some(&all),
            None,
        );
        logger.report_suppressed()
    }))
    .map_err(|e| LogError::host("starting the log thread", e))
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
    #[cfg(test)]
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
            #[cfg(test)]
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
    /// The summary thread, unparked by the first message dropped while it sleeps.
    summaries: std::sync::OnceLock<std::thread::Thread>,
    /// Its timed wake-ups (the tests check that it has none while idle).
    summary_ticks: std::sync::atomic::AtomicU64,
}

struct Limits {
    sites: RateLimiter,
    budget: LogBudget,
    /// The summary thread sleeps with nothing to report: the next drop wakes it.
    summaries_asleep: bool,
}

impl Limits {
    /// Whether a summary is still owed: a site or the budget dropped messages not
    /// reported yet.
    fn pending(&self) -> bool {
        self.sites.any_suppressed() || self.budget.dropped() > 0
    }

    /// Called on every dropped message: whether the summary thread must be woken
    /// (only the first drop after it went to sleep wakes it).
    fn wake_on_drop(&mut self) -> bool {
        std::mem::take(&mut self.summaries_asleep)
    }
}

impl GuardLogger {
    pub fn new(level: LevelFilter, sink: Sink) -> Self {
        GuardLogger {
            level,
            sink,
            limits: Mutex::new(Limits {
                sites: RateLimiter::default(),
                budget: LogBudget::new(Budget::for_level(level), Instant::now()),
                summaries_asleep: false,
            }),
            format: LogFormat::Text,
            summaries: std::sync::OnceLock::new(),
            summary_ticks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn with_format(mut self, format: LogFormat) -> Self {
        self.format = format;
        self
    }

    /// With another budget (tests).
    #[cfg(test)]
    pub fn with_budget(self, budget: Budget, now: Instant) -> Self {
        self.limits.lock().unwrap().budget = LogBudget::new(budget, now);
        self
    }

    /// The line for `msg`: with the request's volume and operation, in the format.
    fn line<'m>(&self, level: Level, target: &str, msg: &'m str) -> Cow<'m, str> {
        with_request(|request| match self.format {
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
    #[cfg(test)]
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
        let (admitted, wake) = {
            let mut limits = self.limits.lock().unwrap();
            let site_admits = level > Level::Warn || {
                let site = Site {
                    module: record.module_path().unwrap_or(record.target()),
                    line: record.line().unwrap_or(0),
                };
                match limits.sites.admit(&site, now) {
                    Admit::Drop => false,
                    Admit::Emit { suppressed } => {
                        suffix = (suppressed > 0).then_some(suppressed);
                        true
                    }
                }
            };
            // Refused, the line counts as dropped, and so do the site's messages its
            // suffix would have reported.
            let admitted = site_admits
                && (record.target() == LIFECYCLE
                    || limits.budget.admit(now, 1 + suffix.unwrap_or(0)));
            (admitted, !admitted && limits.wake_on_drop())
        };
        if wake {
            // The first drop since the summary thread went to sleep: one futex wake.
            self.wake_summaries();
        }
        if !admitted {
            return;
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

    fn wake_summaries(&self) {
        if let Some(thread) = self.summaries.get() {
            thread.unpark();
        }
    }

    /// The summary thread's loop: asleep (parked, no timer) while nothing was
    /// dropped, [`flush_suppressed`](Self::flush_suppressed) every
    /// [`SUMMARY_PERIOD`] / 2 while anything is left to report.
    fn report_suppressed(&self) -> ! {
        // Known before the first sleep, so that no drop can miss it.
        let _ = self.summaries.set(std::thread::current());
        loop {
            loop {
                {
                    let mut limits = self.limits.lock().unwrap();
                    if limits.pending() {
                        limits.summaries_asleep = false;
                        break;
                    }
                    // Set under the lock a drop takes: the drop after it wakes us,
                    // and an unpark before the park below makes the park return.
                    limits.summaries_asleep = true;
                }
                std::thread::park();
            }
            loop {
                std::thread::sleep(SUMMARY_PERIOD / 2);
                self.summary_ticks
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.flush_suppressed(Instant::now());
                if !self.limits.lock().unwrap().pending() {
                    break;
                }
            }
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
