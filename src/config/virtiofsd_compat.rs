//! virtiofsd's other spellings, rewritten into volfsd's own flags before clap sees
//! them, so a launcher's command line starts volfsd unchanged:
//! - the legacy `-o opt[,opt...]` options, parsed as virtiofsd 1.14 parses them
//!   (`parse_compat` in its main.rs): `source=`, `cache=`, `loglevel=`, `sandbox=`,
//!   `xattr`, `allow_direct_io`, `posix_acl`, `announce_submounts`... and their `no_`
//!   forms;
//! - `-f` (no effect), `-d` (debug log level), `--socket` (old name of
//!   `--socket-path`);
//!
//! A virtiofsd option volfsd does not implement is refused by name, in either form.

use super::ConfigError;

/// virtiofsd flags (long form) that volfsd does not implement: refused by name, so a
/// launcher that relies on one learns it at once instead of getting other behaviour.
pub const UNSUPPORTED_FLAGS: &[&str] = &[
    "--xattrmap",
    "--security-label",
    "--writeback",
    "--killpriv-v2",
    "--modcaps",
    "--tag",
];

/// virtiofsd flags that change nothing in volfsd, because it already does what they
/// ask (or, for `--no-killpriv-v2`, what they ask is virtiofsd's default too).
const NO_EFFECT_FLAGS: &[&str] = &["--no-killpriv-v2", "-f"];

/// A command line in volfsd's own flags, and what to tell the operator about it.
#[derive(Debug, Default, Eq, PartialEq)]
pub struct Rewritten {
    pub argv: Vec<String>,
    pub warnings: Vec<String>,
}

/// Rewrites virtiofsd's spellings in `argv` (program name first) into volfsd's flags.
/// Arguments after `--` are left alone.
pub fn rewrite(argv: &[String]) -> Result<Rewritten, ConfigError> {
    let mut out = Rewritten::default();
    let mut args = argv.iter();
    if let Some(prog) = args.next() {
        out.argv.push(prog.clone());
    }
    while let Some(arg) = args.next() {
        if arg == "--" {
            out.argv.push(arg.clone());
            out.argv.extend(args.by_ref().cloned());
            break;
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((n, v)) if arg.starts_with("--") => (n, Some(v)),
            _ => (arg.as_str(), None),
        };
        if let Some(opts) = arg.strip_prefix("-o").filter(|_| !arg.starts_with("--")) {
            let opts = if opts.is_empty() {
                args.next()
                    .ok_or_else(|| ConfigError("-o: a value is required".to_string()))?
                    .as_str()
            } else {
                opts
            };
            for opt in opts.split(',').filter(|o| !o.is_empty()) {
                out.argv.extend(compat_option(opt)?);
            }
        } else if UNSUPPORTED_FLAGS.contains(&name) {
            return Err(unsupported(name));
        } else if NO_EFFECT_FLAGS.contains(&name) {
        } else if name == "-d" {
            out.argv.push("--log-level=debug".to_string());
        } else if name == "--socket" {
            let value = match inline_value {
                Some(v) => v.to_string(),
                None => args
                    .next()
                    .ok_or_else(|| ConfigError("--socket: a value is required".to_string()))?
                    .clone(),
            };
            out.argv.push(format!("--socket-path={value}"));
        } else {
            out.argv.push(arg.clone());
        }
    }
    Ok(out)
}

fn unsupported(name: &str) -> ConfigError {
    ConfigError(format!(
        "option '{name}' is a virtiofsd option that volfsd does not implement"
    ))
}

/// One `-o` option as volfsd flags (none for an option without effect).
fn compat_option(opt: &str) -> Result<Vec<String>, ConfigError> {
    let bad_value = |key: &str, value: &str| {
        ConfigError(format!("-o {key}={value}: invalid value for '-o {key}'"))
    };
    let flag = |f: &str| Ok(vec![f.to_string()]);
    match opt.split_once('=') {
        Some(("source", dir)) => Ok(vec![format!("--shared-dir={dir}")]),
        Some(("cache", v @ ("auto" | "always" | "none" | "metadata"))) => {
            Ok(vec![format!("--cache={v}")])
        }
        Some(("loglevel", v)) => {
            let level = match v {
                "debug" => "debug",
                "info" => "info",
                "warn" => "warn",
                "err" => "error",
                _ => return Err(bad_value("loglevel", v)),
            };
            Ok(vec![format!("--log-level={level}")])
        }
        Some(("sandbox", v @ ("namespace" | "chroot"))) => Ok(vec![format!("--sandbox={v}")]),
        Some((key @ ("cache" | "sandbox"), v)) => Err(bad_value(key, v)),
        Some((key @ ("xattrmap" | "modcaps"), _)) => Err(ConfigError(format!(
            "option '-o {key}' is a virtiofsd option that volfsd does not implement"
        ))),
        Some(_) => Err(ConfigError(format!(
            "-o {opt}: not an option virtiofsd accepts after -o"
        ))),
        None => match opt {
            "xattr" => flag("--xattr"),
            "no_xattr" => flag("--no-xattr"),
            "readdirplus" => flag("--readdirplus"),
            "no_readdirplus" => flag("--no-readdirplus"),
            "allow_direct_io" => flag("--allow-direct-io"),
            "no_allow_direct_io" => flag("--no-allow-direct-io"),
            "posix_acl" => flag("--posix-acl=always"),
            "no_posix_acl" => flag("--posix-acl=never"),
            "announce_submounts" => flag("--announce-submounts"),
            // volfsd's defaults, which these ask for.
            "no_writeback" | "no_killpriv_v2" | "no_security_label" => Ok(Vec::new()),
            // Ignored by virtiofsd too: locks are always served. `posix_lock` and
            // `flock` (the C virtiofsd's, which libvirt still writes) ask for that.
            "no_posix_lock" | "no_flock" | "posix_lock" | "flock" => Ok(Vec::new()),
            "writeback" | "killpriv_v2" | "security_label" => Err(ConfigError(format!(
                "option '-o {opt}' is a virtiofsd option that volfsd does not implement"
            ))),
            _ => Err(ConfigError(format!(
                "-o {opt}: not an option virtiofsd accepts after -o"
            ))),
        },
    }
}

/// Whether `argv` asks for `--print-capabilities`: the vhost-user spec's backend
/// program conventions say it is answered whatever else the command line holds.
pub fn wants_capabilities(argv: &[String]) -> bool {
    argv.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--print-capabilities")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(args: &[&str]) -> Result<Rewritten, ConfigError> {
        let mut argv = vec!["volfsd".to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        rewrite(&argv)
    }

    fn argv(args: &[&str]) -> Vec<String> {
        rw(args).unwrap().argv[1..].to_vec()
    }

    #[test]
    fn libvirt_compat_form() {
        assert_eq!(
            argv(&[
                "--fd=23",
                "-o",
                "source=/srv/share,cache=always,xattr",
                "--thread-pool-size=16"
            ]),
            [
                "--fd=23",
                "--shared-dir=/srv/share",
                "--cache=always",
                "--xattr",
                "--thread-pool-size=16"
            ]
        );
        assert_eq!(argv(&["-osource=/s"]), ["--shared-dir=/s"]);
        assert_eq!(
            argv(&[
                "-o",
                "loglevel=err,no_posix_lock,no_flock,announce_submounts"
            ]),
            ["--log-level=error", "--announce-submounts"]
        );
    }

    #[test]
    fn aliases() {
        assert_eq!(
            argv(&[
                "--socket",
                "/s",
                "-f",
                "-d",
                "--no-killpriv-v2",
                "--socket=/t"
            ]),
            ["--socket-path=/s", "--log-level=debug", "--socket-path=/t"]
        );
    }

    #[test]
    fn unsupported_options_are_named_in_either_form() {
        let e = rw(&["--xattrmap=:map::user.virtiofs.:"]).unwrap_err().0;
        assert!(e.contains("'--xattrmap'"), "{e}");
        let e = rw(&["-o", "xattr,writeback"]).unwrap_err().0;
        assert!(e.contains("'-o writeback'"), "{e}");
        let e = rw(&["-o", "cache=sometimes"]).unwrap_err().0;
        assert!(e.contains("-o cache=sometimes"), "{e}");
        let e = rw(&["-o", "bogus"]).unwrap_err().0;
        assert!(e.contains("-o bogus"), "{e}");
        let e = rw(&["-o"]).unwrap_err().0;
        assert!(e.contains("-o"), "{e}");
    }

    #[test]
    fn after_double_dash_nothing_changes() {
        assert_eq!(argv(&["--", "-o", "x"]), ["--", "-o", "x"]);
    }

    #[test]
    fn capabilities_win_over_everything() {
        let a =
            |v: &[&str]| wants_capabilities(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(a(&["volfsd", "--bogus", "--print-capabilities"]));
        assert!(!a(&["volfsd", "--", "--print-capabilities"]));
    }
}
