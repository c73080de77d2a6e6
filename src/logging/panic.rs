//! A panic's message and place, logged from any thread under any seccomp filter.
//!
//! std's own hook prints a backtrace when `RUST_BACKTRACE` asks for one, and the
//! backtrace asks for the working directory (`getcwd`) to shorten its paths: a call no
//! thread role's list allows, so a confined thread that panicked was killed by SIGSYS
//! and its message went with the process. This hook makes no call a role lacks: it
//! formats the thread's name, the place and the message into one log line (the
//! daemon's lifecycle target, outside the log budget; stderr before logging is set
//! up). Then a thread the daemon cannot run on without (`ends_process` says which:
//! logging knows no thread roles) ends the process with status 101, as a panic on
//! the main thread does; any other thread unwinds and ends (a queue worker's ring
//! stops being served, a control client's connection closes).

use std::any::Any;
use std::panic::PanicHookInfo;

/// The status a panic that ends the process exits with (Rust's own).
const PANIC_STATUS: i32 = 101;

/// Installs the hook, for every thread of the process.
pub fn install(ends_process: fn() -> bool) {
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if ends_process() {
            report_line("the daemon cannot run on without this thread: exiting");
            // SAFETY: ends the process at once; nothing of it is used after.
            unsafe { libc::_exit(PANIC_STATUS) };
        }
    }));
}

fn report(info: &PanicHookInfo<'_>) {
    report_line(&describe(info));
}

fn report_line(line: &str) {
    if super::LOGGER.get().is_some() {
        log::error!(target: super::LIFECYCLE, "{line}");
        log::logger().flush();
    } else {
        eprintln!("volfsd: {line}");
    }
}

/// `thread 'NAME' panicked at FILE:LINE:COLUMN: MESSAGE`.
pub fn describe(info: &PanicHookInfo<'_>) -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("<unnamed>");
    let at = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_else(|| "an unknown place".into());
    format!(
        "thread '{name}' panicked at {at}: {}",
        message(info.payload())
    )
}

fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(a panic without a message)"
    }
}

#[cfg(test)]
mod tests {
    use crate::sandbox::{SeccompMode, ThreadRole};

    const HELPER_ENV: &str = "VOLFSD_PANIC_TEST_HELPER";
    const HELPER: &str = "logging::panic::tests::helper_process_a_confined_thread_panics";

    /// Run in a child process by the test below: with the hook installed and
    /// `RUST_BACKTRACE=full`, a thread confined as each role in turn (kill mode)
    /// panics (the roles the daemon cannot run without last: the first of them ends
    /// the process); the process then exits 0.
    #[test]
    #[ignore = "helper process of the test below"]
    fn helper_process_a_confined_thread_panics() {
        let Ok(which) = std::env::var(HELPER_ENV) else {
            return;
        };
        super::install(|| crate::sandbox::current_role().is_some_and(ThreadRole::is_essential));
        for role in ThreadRole::ALL {
            // The supervisor is a process of its own, with one thread.
            if role == ThreadRole::Supervisor || (which == "ends" && !role.is_essential()) {
                continue;
            }
            if which == "goes-on" && role.is_essential() {
                continue;
            }
            let joined = std::thread::Builder::new()
                .name(format!("panicker-{role:?}"))
                .spawn(move || {
                    crate::sandbox::seccomp::apply(role, SeccompMode::Kill).unwrap();
                    crate::sandbox::set_role_for_test(role);
                    panic!("a test panic under the {role:?} filter");
                })
                .unwrap()
                .join();
            assert!(joined.is_err());
        }
        // SAFETY: ends the helper process at once, with status 0.
        unsafe { libc::_exit(0) };
    }

    fn run_helper(which: &str) -> (std::process::ExitStatus, String) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                HELPER,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, which)
            .env("RUST_BACKTRACE", "full")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[track_caller]
    fn reported(stderr: &str, role: ThreadRole) {
        let want = format!("volfsd: thread 'panicker-{role:?}' panicked at src/logging/panic.rs:");
        assert!(stderr.contains(&want), "no {want:?} in:\n{stderr}");
        assert!(
            stderr.contains(&format!("a test panic under the {role:?} filter")),
            "{stderr}"
        );
    }

    #[test]
    fn a_panic_in_a_confined_thread_is_reported_and_the_thread_ends() {
        use std::os::unix::process::ExitStatusExt;
        let (status, stderr) = run_helper("goes-on");
        assert_eq!(status.signal(), None, "killed: {stderr}");
        assert_eq!(status.code(), Some(0), "{stderr}");
        for role in ThreadRole::ALL {
            if role != ThreadRole::Supervisor && !role.is_essential() {
                reported(&stderr, role);
            }
        }
    }

    #[test]
    fn a_panic_in_a_thread_the_daemon_needs_is_reported_and_ends_it() {
        use std::os::unix::process::ExitStatusExt;
        let (status, stderr) = run_helper("ends");
        assert_eq!(status.signal(), None, "killed: {stderr}");
        assert_eq!(status.code(), Some(101), "{stderr}");
        let first = ThreadRole::ALL
            .into_iter()
            .find(|r| r.is_essential())
            .unwrap();
        reported(&stderr, first);
        assert!(
            stderr.contains("cannot run on without this thread"),
            "{stderr}"
        );
    }
}
