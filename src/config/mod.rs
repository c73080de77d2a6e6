//! The command line: virtiofsd-compatible flags, parsed with clap and validated into a
//! [`Config`]. Every error names the flag and the value.

use std::fmt;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::fs::file_handle::FileHandleMode;
use crate::fs::id_translate::{IdKind, IdTranslation};
use crate::fs::names::{valid_volume_name, VOLUME_NAME_RULE};
use crate::fs::{resolve_share_path, CacheMode, Limits, ShareSpec};
use crate::logging::LogFormat;
use crate::qos::{self, RateLimit};
use crate::sandbox::{IdMaps, IdRange, SandboxMode, SeccompMode};
use crate::state::{LoadOptions, MigrationMode, SaveOptions};

mod args;
#[cfg(test)]
mod tests;
pub mod virtiofsd_compat;

pub use args::{Args, PosixAclArg};

/// Where the vhost-user socket comes from.
#[derive(Clone, Debug, Eq, PartialEq)]
pub enum SocketSource {
    Path(PathBuf),
    Fd(RawFd),
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub socket: SocketSource,
    /// --socket-group, resolved to a gid.
    pub socket_group: Option<u32>,
    pub shared_dir: PathBuf,
    /// None: the whole SharedDir; Some: only these shares, under a virtual root.
    pub allowed_dirs: Option<Vec<ShareSpec>>,
    pub control_socket: Option<PathBuf>,
    pub control_allow_uids: Vec<u32>,
    pub cache: CacheMode,
    pub num_request_queues: usize,
    /// `--poll-us`: each queue's polling window after its ring ran dry.
    pub poll: std::time::Duration,
    pub limits: Limits,
    pub readonly: bool,
    pub xattr: bool,
    pub privileged_xattrs: bool,
    pub posix_acl: PosixAclArg,
    pub uids: IdTranslation,
    pub gids: IdTranslation,
    /// `--uid-map`/`--gid-map`: the unprivileged namespace sandbox's id maps.
    pub id_maps: IdMaps,
    pub allow_direct_io: bool,
    pub readdirplus: bool,
    pub preserve_noatime: bool,
    pub announce_submounts: bool,
    /// Per-operation metrics (not with `--no-metrics`).
    pub metrics: bool,
    /// What the command line's rewriting (virtiofsd_compat) has to tell the operator,
    /// logged once logging is up.
    pub warnings: Vec<String>,
    pub log_level: log::LevelFilter,
    pub log_format: LogFormat,
    pub syslog: bool,
    pub rlimit_nofile: Option<u64>,
    pub sandbox: SandboxMode,
    pub seccomp: SeccompMode,
    pub file_handles: FileHandleMode,
    /// `--migration-*`: how the device state is written and read.
    pub migration: MigrationOptions,
    /// `--keep-serving`.
    pub keep_serving: bool,
    /// `--upgradable`: a connection keeper above the serving process (src/keeper/).
    pub upgradable: bool,
    /// Started by the keeper: the control socket's fd to take over (not bound again).
    pub control_fd: Option<i32>,
    /// Started by the keeper: its end of the keeper's channel.
    pub keeper_channel_fd: Option<i32>,
    /// Started by the keeper: the session region, and the journal halves.
    pub keeper_region: Option<KeeperRegion>,
    pub keeper_volumes: Option<String>,
    /// Started for an upgrade: a pidfd of the serving process it replaces.
    pub keeper_source_pidfd: Option<i32>,
    /// `--translate-uid`/`--translate-gid` as given (the device state compares them).
    pub translate_rules: (Vec<String>, Vec<String>),
}

/// A serving process started by the keeper: its session region and journal halves.
#[derive(Clone, Copy, Debug)]
pub struct KeeperRegion {
    pub fd: i32,
    /// The half it records into.
    pub journal: crate::region::Half,
    /// After a crash under a guest's session: the half to serve the guest on from.
    pub recover: Option<crate::region::Half>,
}

impl Config {
    /// The options the guest's view depends on, as the device state records them.
    pub fn guest_view(&self) -> crate::state::format::GuestView {
        crate::state::format::GuestView {
            cache: match self.cache {
                CacheMode::None => "none",
                CacheMode::Auto => "auto",
                CacheMode::Always => "always",
                CacheMode::Metadata => "metadata",
            }
            .to_string(),
            xattr: self.xattr,
            privileged_xattrs: self.privileged_xattrs,
            translate_uid: self.translate_rules.0.clone(),
            translate_gid: self.translate_rules.1.clone(),
            whole_share: self.allowed_dirs.is_none(),
        }
    }
}

/// The `--migration-*` flags.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct MigrationOptions {
    pub save: SaveOptions,
    pub load: LoadOptions,
}

#[derive(Debug, Eq, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Parses a command line (program name first) as volfsd or virtiofsd would write it,
/// into a validated [`Config`].
pub fn parse(argv: &[String]) -> Result<Config, ParseError> {
    let rewritten = virtiofsd_compat::rewrite(argv).map_err(ParseError::Config)?;
    let args = Args::try_parse_from(&rewritten.argv).map_err(ParseError::Clap)?;
    let mut config = args.into_config().map_err(ParseError::Config)?;
    config.warnings = rewritten.warnings;
    Ok(config)
}

/// Why a command line was not a configuration.
#[derive(Debug)]
pub enum ParseError {
    /// clap's own: an unknown flag or value, or `--help`/`--version` (printed by it).
    Clap(clap::Error),
    Config(ConfigError),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Clap(e) => write!(f, "{e}"),
            ParseError::Config(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ParseError {}

impl Args {
    pub fn into_config(mut self) -> Result<Config, ConfigError> {
        if let Some(fd) = self.keeper_listen_fd {
            // Started by the keeper (src/keeper/upgrade.rs): it holds the frontend's
            // socket; this process serves the keeper on its private listener.
            (self.socket_path, self.fd, self.socket_group) = (None, Some(fd), None);
            self.upgradable = false;
        }
        let socket = match (self.socket_path, self.fd) {
            (Some(p), None) => SocketSource::Path(p),
            (None, Some(fd)) if fd >= 0 => SocketSource::Fd(fd),
            (None, Some(fd)) => return Err(ConfigError(format!("--fd {fd}: not a valid fd"))),
            (None, None) => {
                return Err(ConfigError(
                    "one of --socket-path or --fd is required".to_string(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError(
                    "--socket-path and --fd cannot be used together".to_string(),
                ))
            }
        };
        if let SocketSource::Path(p) = &socket {
            check_socket_path("--socket-path", p)?;
        }
        if let Some(p) = &self.control_socket {
            check_socket_path("--control-socket", p)?;
        }
        let socket_group = match (&self.socket_group, &socket) {
            (None, _) => None,
            (Some(g), SocketSource::Path(_)) => Some(resolve_group(g)?),
            (Some(_), SocketSource::Fd(_)) => {
                return Err(ConfigError(
                    "--socket-group applies to --socket-path, not to --fd".to_string(),
                ))
            }
        };
        let shared_dir = self
            .shared_dir
            .ok_or_else(|| ConfigError("--shared-dir is required".to_string()))?;
        let meta = std::fs::metadata(&shared_dir)
            .map_err(|e| ConfigError(format!("--shared-dir {}: {e}", shared_dir.display())))?;
        if !meta.is_dir() {
            return Err(ConfigError(format!(
                "--shared-dir {}: not a directory",
                shared_dir.display()
            )));
        }
        let shared_dir = shared_dir
            .canonicalize()
            .map_err(|e| ConfigError(format!("--shared-dir {}: {e}", shared_dir.display())))?;
        // The whole SharedDir is served only when neither allowed dirs nor a control
        // socket are given; otherwise the root is virtual and lists only volumes.
        let allowed_dirs = if self.allowed_dir.is_empty() {
            self.control_socket.as_ref().map(|_| Vec::new())
        } else {
            Some(parse_allowed_dirs(&shared_dir, &self.allowed_dir)?)
        };
        let translate_rules = (self.translate_uid.clone(), self.translate_gid.clone());
        let uids = IdTranslation::parse(IdKind::Uid, &self.translate_uid)
            .map_err(|e| ConfigError(e.to_string()))?;
        let gids = IdTranslation::parse(IdKind::Gid, &self.translate_gid)
            .map_err(|e| ConfigError(e.to_string()))?;
        if self.posix_acl != PosixAclArg::Never && !(uids.is_identity() && gids.is_identity()) {
            return Err(ConfigError(
                "--translate-uid/--translate-gid cannot be used with --posix-acl: an ACL names \
                 host ids the guest would see untranslated"
                    .to_string(),
            ));
        }
        let parse_maps = |flag: &str, v: &[String]| {
            v.iter()
                .map(|m| IdRange::parse(flag, m))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError(e.to_string()))
        };
        let id_maps = IdMaps {
            uids: parse_maps("--uid-map", &self.uid_map)?,
            gids: parse_maps("--gid-map", &self.gid_map)?,
        };
        if self.migration_mode == MigrationMode::FileHandles
            && (self.migration_verify_handles || self.migration_confirm_paths)
        {
            // virtiofsd's rule: with handles they would check nothing more.
            return Err(ConfigError(
                "--migration-mode=file-handles cannot be used with --migration-verify-handles \
                 or --migration-confirm-paths: they apply to find-paths"
                    .to_string(),
            ));
        }
        let migration = MigrationOptions {
            save: SaveOptions {
                mode: self.migration_mode,
                verify_handles: self.migration_verify_handles,
                confirm_paths: self.migration_confirm_paths,
            },
            load: LoadOptions {
                on_error: self.migration_on_error,
                after_crash: false,
            },
        };
        Ok(Config {
            socket,
            socket_group,
            shared_dir,
            allowed_dirs,
            control_socket: self.control_socket,
            control_allow_uids: self.control_allow_uid,
            cache: self.cache.into(),
            num_request_queues: self.num_request_queues as usize,
            poll: std::time::Duration::from_micros(self.poll_us),
            limits: Limits {
                max_nodes: self.max_inodes,
                max_handles: self.max_handles,
                max_lock_files: self.max_lock_files,
            },
            readonly: self.readonly,
            xattr: self.xattr || self.posix_acl != PosixAclArg::Never,
            posix_acl: self.posix_acl,
            uids,
            gids,
            id_maps,
            allow_direct_io: self.allow_direct_io,
            readdirplus: !self.no_readdirplus,
            preserve_noatime: self.preserve_noatime,
            announce_submounts: !self.no_announce_submounts,
            metrics: !self.no_metrics,
            warnings: Vec::new(),
            privileged_xattrs: self.allow_privileged_xattrs,
            log_level: self.log_level.into(),
            log_format: self.log_format.into(),
            syslog: self.syslog,
            rlimit_nofile: self.rlimit_nofile,
            sandbox: self.sandbox,
            seccomp: self.seccomp,
            file_handles: self.inode_file_handles.into(),
            migration,
            keep_serving: self.keep_serving,
            upgradable: self.upgradable,
            control_fd: self.keeper_control_fd,
            keeper_channel_fd: self.keeper_channel_fd,
            keeper_region: self.keeper_region_fd.map(|fd| KeeperRegion {
                fd,
                journal: crate::region::Half::from_index(self.keeper_journal.unwrap_or(0))
                    .unwrap_or(crate::region::Half::A),
                recover: self
                    .keeper_recover
                    .and_then(crate::region::Half::from_index),
            }),
            keeper_volumes: self.keeper_volumes,
            keeper_source_pidfd: self.keeper_source_pidfd,
            translate_rules,
        })
    }
}

/// The longest path a Unix socket can be bound at (`sun_path` is 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A socket path must fit `sun_path` and its parent directory must exist.
pub fn check_socket_path(flag: &str, path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::ffi::OsStrExt;
    let len = path.as_os_str().as_bytes().len();
    if len == 0 {
        return Err(ConfigError(format!("{flag}: empty path")));
    }
    if len > MAX_SOCKET_PATH {
        return Err(ConfigError(format!(
            "{flag} {}: {len} bytes, longer than the {MAX_SOCKET_PATH} a Unix socket path may have",
            path.display()
        )));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ConfigError(format!(
            "{flag} {}: {} is not a directory",
            path.display(),
            parent.display()
        ))),
        Err(e) => Err(ConfigError(format!(
            "{flag} {}: directory {}: {e}",
            path.display(),
            parent.display()
        ))),
    }
}

/// A group name (as virtiofsd takes it) or, failing that, a numeric gid.
fn resolve_group(group: &str) -> Result<u32, ConfigError> {
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => group
            .parse::<u32>()
            .map_err(|_| ConfigError(format!("--socket-group {group}: no such group"))),
        Err(e) => Err(ConfigError(format!("--socket-group {group}: {e}"))),
    }
}

/// Splits the rate-limit options off `PATH[:ro|:rw][,KEY=N...]`: the trailing
/// comma-separated items that are all `KEY=N` with a key of [`qos::OPTIONS`], so a
/// path with a comma of its own is left whole.
pub fn split_rate_limit(arg: &str) -> Result<(&str, Option<RateLimit>), qos::QosError> {
    let mut path = arg;
    let mut options = Vec::new();
    while let Some((head, tail)) = path.rsplit_once(',') {
        let key = tail.split_once('=').map_or(tail, |(k, _)| k);
        if !qos::OPTIONS.contains(&key) {
            break;
        }
        options.push(tail);
        path = head;
    }
    if options.is_empty() {
        return Ok((arg, None));
    }
    let mut limit = RateLimit::default();
    for o in options.iter().rev() {
        limit.set_option(o)?;
    }
    limit.check()?;
    Ok((path, Some(limit)))
}

/// Splits `PATH[:ro|:rw]`; a path that itself ends in `:ro` can be written `PATH:ro:rw`.
pub fn split_access(arg: &str) -> (&str, bool) {
    match arg.rsplit_once(':') {
        Some((p, "ro")) => (p, true),
        Some((p, "rw")) => (p, false),
        _ => (arg, false),
    }
}

/// Validates every `--allowed-dir`: each must resolve inside SharedDir, and no two may
/// be the same or nested in one another.
pub fn parse_allowed_dirs(
    shared_dir: &Path,
    args: &[String],
) -> Result<Vec<ShareSpec>, ConfigError> {
    let mut specs: Vec<ShareSpec> = Vec::new();
    for arg in args {
        let (path, rate_limit) = split_rate_limit(arg)
            .map_err(|why| ConfigError(format!("--allowed-dir {arg}: {why}")))?;
        let (path, read_only) = split_access(path);
        let resolved = resolve_share_path(shared_dir, Path::new(path))
            .map_err(|why| ConfigError(format!("--allowed-dir {arg}: {why}")))?;
        if let Some(bad) = resolved.rel.iter().find(|c| !valid_volume_name(c)) {
            return Err(ConfigError(format!(
                "--allowed-dir {arg}: '{bad}' does not match the volume-name rule {VOLUME_NAME_RULE}"
            )));
        }
        if let Some(other) = specs.iter().find(|s| s.path.overlaps(&resolved)) {
            let what = if other.path.rel == resolved.rel {
                "is given twice"
            } else {
                "overlaps"
            };
            return Err(ConfigError(format!(
                "--allowed-dir {arg}: {what} --allowed-dir {}",
                other.path.rel_string()
            )));
        }
        specs.push(ShareSpec {
            guest: resolved.rel.clone(),
            path: resolved,
            read_only,
            volume_id: None,
            rate_limit,
        });
    }
    Ok(specs)
}

/// The vhost-user "backend program conventions" capabilities document. The features
/// are the ones libvirt and Incus probe for, each of which volfsd has:
/// - `separate-options`: the `--shared-dir`/`--cache`/`--xattr` syntax (else libvirt
///   falls back to `-o source=...`, which volfsd also accepts);
/// - `posix-acl-negotiation-mode`: `--posix-acl=never|auto|always`.
///
/// `migrate-precopy` is not listed: volfsd cannot migrate a guest's state.
pub fn capabilities_json() -> &'static str {
    concat!(
        "{\n",
        "  \"type\": \"fs\",\n",
        "  \"features\": [\n",
        "    \"migrate-precopy\",\n",
        "    \"posix-acl-negotiation-mode\",\n",
        "    \"separate-options\"\n",
        "  ]\n",
        "}"
    )
}
