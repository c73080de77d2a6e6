//! Writes volfsd's man page and shell completions from its clap definitions, so they
//! never drift from the flags the daemon really takes:
//!
//! - `volfsd.1`: the daemon's options (`volfsd::exports::config::Args`), with a CONTROL CLIENT
//!   section for `volfsd ctl` (`volfsd::exports::control::client::CtlArgs`, a second parser
//!   that src/main.rs dispatches by hand);
//! - `volfsd.bash`, `_volfsd` (zsh), `volfsd.fish`: completions of both, `ctl` as a
//!   subcommand of `volfsd`.
//!
//! Usage: `cargo run -p volfsd-docgen -- OUTDIR` (packaging/build-deb.sh runs it).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Arg, ArgAction, Command, CommandFactory};
use clap_complete::Shell;
use clap_mangen::Man;
use roff::{bold, italic, roman, Inline, Roff};

use volfsd::exports::config::Args;
use volfsd::exports::control::client::CtlArgs;

const BIN: &str = "volfsd";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let out = match argv.as_slice() {
        [dir] if !dir.starts_with('-') => PathBuf::from(dir),
        _ => {
            eprintln!("usage: volfsd-docgen OUTDIR");
            return ExitCode::from(2);
        }
    };
    match generate(&out) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("volfsd-docgen: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

/// Writes every file into `out` (created if missing); returns their paths.
fn generate(out: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(out)?;
    let mut files = Vec::new();

    let page = out.join("volfsd.1");
    fs::write(&page, man_page()?)?;
    files.push(page);

    let mut cmd = completion_command();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        files.push(clap_complete::generate_to(shell, &mut cmd, BIN, out)?);
    }
    Ok(files)
}

/// The daemon's command line, as the man page shows it.
fn daemon_command() -> Command {
    let mut cmd = Args::command();
    cmd.build();
    cmd
}

/// `volfsd ctl`'s command line, named as it is typed.
fn ctl_command() -> Command {
    let mut cmd = CtlArgs::command().name("ctl").bin_name("volfsd ctl");
    cmd.build();
    cmd
}

/// One command for the completions: the daemon's options, and `ctl` with its own
/// subcommands (which take none of the daemon's options).
fn completion_command() -> Command {
    Args::command()
        .subcommand(CtlArgs::command().name("ctl"))
        .args_conflicts_with_subcommands(true)
}

/// volfsd.1: clap_mangen's sections for the daemon, a CONTROL CLIENT section made
/// from `CtlArgs`, then the version.
fn man_page() -> io::Result<Vec<u8>> {
    let man = Man::new(daemon_command()).manual("volfsd manual");
    let mut w = Vec::new();
    man.render_title(&mut w)?;
    man.render_name_section(&mut w)?;
    man.render_synopsis_section(&mut w)?;
    man.render_description_section(&mut w)?;
    man.render_options_section(&mut w)?;
    ctl_section(&ctl_command()).to_writer(&mut w)?;
    man.render_version_section(&mut w)?;
    w.flush()?;
    Ok(w)
}

/// `volfsd ctl`: its synopsis, its global options, then each subcommand with its
/// arguments, all from the clap definition.
fn ctl_section(ctl: &Command) -> Roff {
    let mut roff = Roff::default();
    roff.control("SH", ["CONTROL CLIENT"]);
    roff.text([
        bold("volfsd ctl"),
        roman(" ["),
        italic("OPTIONS"),
        roman("] "),
        italic("COMMAND"),
    ]);
    roff.control("PP", []);
    if let Some(about) = ctl.get_about() {
        roff.text([roman(format!("{about}."))]);
    }
    roff.text([
        roman("A client for the daemon's control socket (see "),
        bold("--control-socket"),
        roman(" above)."),
    ]);

    roff.control("SS", ["Options"]);
    for arg in visible_args(ctl).filter(|a| !a.is_positional()) {
        arg_entry(&mut roff, arg);
    }

    roff.control("SS", ["Commands"]);
    for sub in ctl_subcommands(ctl) {
        let mut line = vec![bold(format!("volfsd ctl {}", sub.get_name()))];
        for arg in visible_args(sub).filter(|a| !a.is_global_set()) {
            line.push(roman(" "));
            line.extend(arg_synopsis(arg));
        }
        roff.control("TP", []);
        roff.text(line);
        if let Some(about) = sub.get_long_about().or_else(|| sub.get_about()) {
            roff.text([roman(about.to_string())]);
        }
        let options: Vec<&Arg> = visible_args(sub)
            .filter(|a| !a.is_positional() && !a.is_global_set())
            .collect();
        if !options.is_empty() {
            roff.control("RS", []);
            for arg in options {
                arg_entry(&mut roff, arg);
            }
            roff.control("RE", []);
        }
    }
    roff
}

/// `volfsd ctl`'s commands, without clap's own `help`.
fn ctl_subcommands(ctl: &Command) -> impl Iterator<Item = &Command> {
    ctl.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// The arguments a user can type: not hidden, not clap's own --help.
fn visible_args(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_action(), ArgAction::Help))
}

/// `--long VALUE` or `NAME`, optional ones in brackets.
fn arg_synopsis(arg: &Arg) -> Vec<Inline> {
    let mut parts = Vec::new();
    let optional = !arg.is_required_set();
    if optional {
        parts.push(roman("["));
    }
    if let Some(long) = arg.get_long() {
        parts.push(bold(format!("--{long}")));
        if takes_value(arg) {
            parts.push(roman(" "));
            parts.push(italic(value_name(arg)));
        }
    } else {
        parts.push(italic(value_name(arg)));
    }
    if optional {
        parts.push(roman("]"));
    }
    parts
}

/// A `.TP` entry: the option, then its help text.
fn arg_entry(roff: &mut Roff, arg: &Arg) {
    roff.control("TP", []);
    let mut head = Vec::new();
    if let Some(long) = arg.get_long() {
        head.push(bold(format!("--{long}")));
        if takes_value(arg) {
            head.push(roman(" "));
            head.push(italic(value_name(arg)));
        }
    } else {
        head.push(italic(value_name(arg)));
    }
    roff.text(head);
    if let Some(help) = arg.get_long_help().or_else(|| arg.get_help()) {
        roff.text([roman(help.to_string())]);
    }
}

fn takes_value(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set | ArgAction::Append)
}

fn value_name(arg: &Arg) -> String {
    match arg.get_value_names() {
        Some(names) if !names.is_empty() => names.join(" "),
        _ => arg.get_id().as_str().to_uppercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible daemon flag and every ctl subcommand reaches the page.
    #[test]
    fn man_page_lists_every_flag_and_ctl_command() {
        let page = String::from_utf8(man_page().unwrap()).unwrap();
        for arg in visible_args(&daemon_command()) {
            if let Some(long) = arg.get_long() {
                // roff escapes '-' as '\-'.
                let shown = format!("\\-\\-{}", long.replace('-', "\\-"));
                assert!(page.contains(&shown), "--{long} missing from volfsd.1");
            }
        }
        assert!(page.contains(".SH \"CONTROL CLIENT\""));
        let ctl = ctl_command();
        let subs: Vec<_> = ctl_subcommands(&ctl).map(|s| s.get_name()).collect();
        assert_eq!(
            subs,
            ["attach", "detach", "limit", "list", "stats", "metrics", "upgrade"]
        );
        for sub in ctl_subcommands(&ctl) {
            assert!(
                page.contains(&format!("volfsd ctl {}", sub.get_name())),
                "ctl {} missing from volfsd.1",
                sub.get_name()
            );
        }
    }

    /// The completion command passes clap's own consistency checks.
    #[test]
    fn completion_command_is_valid() {
        completion_command().debug_assert();
    }

    #[test]
    fn writes_all_files() {
        let dir = std::env::temp_dir().join(format!("volfsd-docgen-{}", std::process::id()));
        let files = generate(&dir).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["volfsd.1", "volfsd.bash", "_volfsd", "volfsd.fish"]);
        let bash = fs::read_to_string(dir.join("volfsd.bash")).unwrap();
        assert!(bash.contains("--shared-dir") && bash.contains("attach"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
