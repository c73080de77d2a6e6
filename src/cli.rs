//! The command line: `volfsd [FLAGS]` runs the daemon, `volfsd ctl ...` the control
//! socket's client, `--print-capabilities` answers a launcher (virtiofsd's
//! spelling). The binary (`main.rs`) only calls [`main`].

use std::process::ExitCode;

use clap::Parser;

use crate::config::{self, ParseError};
use crate::control::client::{self, CtlArgs};
use crate::daemon;
use crate::sandbox::supervisor::SUPERVISOR_ARG;

/// Runs what the command line asks; its exit code.
pub fn main() -> ExitCode {
    // The namespace sandbox's supervisor, executed afresh: before anything else, so
    // that it touches as little memory as it can.
    if std::env::args_os().nth(1).as_deref() == Some(SUPERVISOR_ARG.as_ref()) {
        crate::sandbox::supervisor::supervisor_main(std::env::args_os());
    }
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("ctl") {
        return ctl(&argv[1..]);
    }
    if config::virtiofsd_compat::wants_capabilities(&argv) {
        println!("{}", config::capabilities_json());
        return ExitCode::SUCCESS;
    }
    let config = match config::parse(&argv) {
        Ok(c) => c,
        Err(ParseError::Clap(e)) => {
            // --help and --version print and exit 0; real errors exit 1 (clap says 2).
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
        Err(ParseError::Config(e)) => {
            eprintln!("volfsd: {e}");
            return ExitCode::from(1);
        }
    };
    match daemon::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The fatal error, once at exit: outside the log budget.
            log::error!(target: crate::logging::LIFECYCLE, "{e}");
            eprintln!("volfsd: {e}");
            ExitCode::from(1)
        }
    }
}

/// `volfsd ctl ...`: the control socket client.
fn ctl(argv: &[String]) -> ExitCode {
    let args = match CtlArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match client::run(args) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("volfsd ctl: {e}");
            ExitCode::from(1)
        }
    }
}
