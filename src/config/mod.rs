//! The command line: virtiofsd-compatible flags, parsed with clap and validated into a
//! [`Config`]. Every error names the flag and the value.

use std::fmt;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};

use crate::device::MAX_REQUEST_QUEUES;
use crate::fs::file_handle::FileHandleMode;
use crate::fs::id_translate::{IdKind, IdTranslation};
use crate::fs::names::{valid_volume_name, VOLUME_NAME_RULE};
use crate::fs::{resolve_share_path, AclMode, CacheMode, Limits, ShareSpec};
use crate::logging::LogFormat;
use crate::qos::{self, RateLimit};
use crate::sandbox::{IdMaps, IdRange, SandboxMode, SeccompMode};
use crate::state::{LoadOptions, MigrationMode, OnError, SaveOptions};

pub mod virtiofsd_compat;

#[derive(Clone, Copy, Debug, Eq, PartialEq, ValueEnum)]
pub enum CacheArg {
    /// Nothing is cached in the guest (the default).
    None,
    /// Alias of `none`, as in virtiofsd.
    Never,
    /// Metadata and data cached for 1 s, as in virtiofsd.
    Auto,
    /// Metadata and data cached until the guest drops them, as in virtiofsd.
    Always,
    /// Attributes, entries and directory listings cached until the guest drops them,
    /// file data not (direct I/O), as in virtiofsd.
    Metadata,
}

impl From<CacheArg> for CacheMode {
    fn from(c: CacheArg) -> Self {
        match c {
            CacheArg::None | CacheArg::Never => CacheMode::None,
            CacheArg::Auto => CacheMode::Auto,
            CacheArg::Always => CacheMode::Always,
            CacheArg::Metadata => CacheMode::Metadata,
        }
    }
}

#[derive(Clone, Copy, Debug, Eq, PartialEq, ValueEnum)]
pub enum FileHandlesArg {
    Never,
    Prefer,
    /// virtiofsd's deprecated alias of `prefer`.
    #[value(hide = true)]
    Fallback,
    Mandatory,
}

impl From<FileHandlesArg> for FileHandleMode {
    fn from(a: FileHandlesArg) -> Self {
        match a {
            FileHandlesArg::Never => FileHandleMode::Never,
            FileHandlesArg::Prefer | FileHandlesArg::Fallback => FileHandleMode::Prefer,
            FileHandlesArg::Mandatory => FileHandleMode::Mandatory,
        }
    }
}

/// `--posix-acl`, as in virtiofsd: when to negotiate POSIX ACLs with the guest.
#[derive(Clone, Copy, Debug, Eq, PartialEq, ValueEnum)]
pub enum PosixAclArg {
    /// Never: `system.posix_acl_*` are refused, as in virtiofsd.
    Never,
    /// When the guest kernel supports them.
    Auto,
    /// Always: a guest that cannot use them fails FUSE INIT.
    Always,
}

impl From<PosixAclArg> for AclMode {
    fn from(a: PosixAclArg) -> Self {
        match a {
            PosixAclArg::Never => AclMode::Never,
            PosixAclArg::Auto => AclMode::Auto,
            PosixAclArg::Always => AclMode::Always,
        }
    }
}

#[derive(Clone, Copy, Debug, Eq, PartialEq, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(f: LogFormatArg) -> Self {
        match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

#[derive(Clone, Copy, Debug, Eq, PartialEq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
    Off,
}

impl From<LogLevel> for log::LevelFilter {
    fn from(l: LogLevel) -> Self {
        match l {
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
            LogLevel::Off => log::LevelFilter::Off,
        }
    }
}

/// vhost-user virtio-fs backend for MicroVM sandbox platforms.
#[derive(Debug, Parser)]
// A flag given twice takes its last value, as in virtiofsd: launchers append their
// extra arguments after their own.
#[command(name = "volfsd", version, about, long_about = None, args_override_self = true)]
pub struct Args {
    /// vhost-user socket to create and listen on; one frontend is served.
    #[arg(long, value_name = "PATH", conflicts_with = "fd")]
    pub socket_path: Option<PathBuf>,

    /// Group of the vhost-user socket, as in virtiofsd: the socket is made mode 0770
    /// and owned by this group (a name, or a numeric gid), so a VMM running as another
    /// user in that group can connect. Without it the socket is 0700.
    #[arg(long, value_name = "GROUP", conflicts_with = "fd")]
    pub socket_group: Option<String>,

    /// An inherited, already listening vhost-user socket (instead of --socket-path).
    #[arg(long, value_name = "N")]
    pub fd: Option<RawFd>,

    /// The host directory served to the guest.
    #[arg(long, value_name = "DIR")]
    pub shared_dir: Option<PathBuf>,

    /// A directory of SharedDir the guest may see (absolute or relative to SharedDir),
    /// read-write (default) or read-only, with optional rate limits (token buckets:
    /// ops_size, ops_one_time_burst, ops_refill_time_ms, bw_size, bw_one_time_burst,
    /// bw_refill_time_ms; a refill time defaults to 1000 ms). Repeatable. Without any,
    /// the whole SharedDir is served.
    #[arg(long = "allowed-dir", value_name = "PATH[:ro|:rw][,KEY=N...]")]
    pub allowed_dir: Vec<String>,

    /// Control socket (HTTP/1.1 + JSON) to attach and detach volumes at runtime.
    /// Without --allowed-dir, the guest then starts with an empty root.
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,

    /// A uid allowed on the control socket besides root and the daemon's own uid.
    /// Repeatable.
    #[arg(long, value_name = "UID")]
    pub control_allow_uid: Vec<u32>,

    /// Guest cache policy.
    #[arg(long, value_enum, default_value = "none")]
    pub cache: CacheArg,

    /// Accepted for virtiofsd compatibility; each request queue is served by its own
    /// thread (see --num-request-queues). 0 or 1 processes requests in the queue thread.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub thread_pool_size: usize,

    /// Request queues offered to the frontend (the VMM may use fewer), 1 to 63.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=MAX_REQUEST_QUEUES as i64))]
    pub num_request_queues: u16,

    /// Most node ids the guest may hold in one volume (each keeps a host fd open,
    /// unless kept by file handle); past it, lookups of new files get ENFILE.
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_nodes,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_inodes: usize,

    /// Most open files and directories the guest may hold in one volume; past it,
    /// opens get ENFILE.
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_handles,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_handles: usize,

    /// Most lock files (one per file and guest process holding POSIX locks) in one
    /// volume; past it, lock requests get ENFILE.
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_lock_files,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_lock_files: usize,

    /// With --xattr, let the guest set trusted.* and security.* attributes (as root
    /// on the host). Without it they are refused with EPERM and hidden.
    #[arg(long, requires = "xattr")]
    pub allow_privileged_xattrs: bool,

    /// Serve the whole share read-only.
    #[arg(long)]
    pub readonly: bool,

    /// Enable extended attributes.
    #[arg(long, overrides_with = "no_xattr")]
    pub xattr: bool,

    /// virtiofsd's `-o no_xattr`: extended attributes off (the default).
    #[arg(long, hide = true)]
    pub no_xattr: bool,

    /// POSIX ACLs, as in virtiofsd (`--posix-acl` alone is `always`; implies
    /// --xattr): the guest kernel checks permissions against them, the daemon stores
    /// them, and a directory's default ACL is inherited by what the guest creates in it.
    #[arg(long, value_enum, require_equals = true, num_args = 0..=1,
          default_value = "never", default_missing_value = "always",
          value_name = "never|auto|always")]
    pub posix_acl: PosixAclArg,

    /// Honour the guest's O_DIRECT: host files are opened with it, as in virtiofsd.
    /// Without it O_DIRECT is dropped (guest buffers need not meet the host file
    /// system's alignment).
    #[arg(long, overrides_with = "no_allow_direct_io")]
    pub allow_direct_io: bool,

    /// virtiofsd's `-o no_allow_direct_io` (the default).
    #[arg(long, hide = true)]
    pub no_allow_direct_io: bool,

    /// Do not offer READDIRPLUS to the guest, as in virtiofsd.
    #[arg(long, overrides_with = "readdirplus")]
    pub no_readdirplus: bool,

    /// virtiofsd's `-o readdirplus` (the default).
    #[arg(long, hide = true)]
    pub readdirplus: bool,

    /// Translate uids between guest and host, as in virtiofsd:
    /// `guest|host|squash-guest|squash-host|map:SOURCE:TARGET:COUNT` or
    /// `forbid-guest:SOURCE:COUNT`. Repeatable. Not with --posix-acl (an ACL holds
    /// untranslated ids).
    #[arg(long, value_name = "TYPE:SOURCE:TARGET:COUNT")]
    pub translate_uid: Vec<String>,

    /// The same for gids.
    #[arg(long, value_name = "TYPE:SOURCE:TARGET:COUNT")]
    pub translate_gid: Vec<String>,

    /// A range of host uids mapped into the user namespace an unprivileged daemon
    /// makes with `--sandbox namespace`, as in virtiofsd (libvirt's session mode):
    /// `:NAMESPACE_UID:HOST_UID:COUNT:`. Repeatable; mapping ids other than one's
    /// own needs newuidmap (Debian package uidmap) and /etc/subuid.
    #[arg(long, value_name = ":NS_UID:HOST_UID:COUNT:")]
    pub uid_map: Vec<String>,

    /// The same for gids (newgidmap, /etc/subgid).
    #[arg(long, value_name = ":NS_GID:HOST_GID:COUNT:")]
    pub gid_map: Vec<String>,

    /// Do not tell the guest which directories are mount points, as in virtiofsd
    /// (they then share the share's st_dev, and inode numbers of two file systems
    /// may collide in the guest). `--announce-submounts` is the default.
    #[arg(long, overrides_with = "announce_submounts")]
    pub no_announce_submounts: bool,

    /// Tell the guest which directories are mount points (the default).
    #[arg(long)]
    pub announce_submounts: bool,

    /// Keep the guest's O_NOATIME on the host, as in virtiofsd; by default it is
    /// dropped, since it needs the file's owner or CAP_FOWNER (an unprivileged daemon
    /// would fail such opens with EPERM).
    #[arg(long)]
    pub preserve_noatime: bool,

    /// Accepted for virtiofsd compatibility: volfsd always lets the guest map files
    /// shared, with every cache mode.
    #[arg(long)]
    pub allow_mmap: bool,

    /// Log level.
    #[arg(long, value_enum, default_value = "info")]
    pub log_level: LogLevel,

    /// Keep only the per-volume totals: no per-operation counts, durations or errno
    /// classes in `GET /metrics` (each request then skips two clock reads).
    #[arg(long)]
    pub no_metrics: bool,

    /// Log lines as text (the default) or one JSON object each, with the volume and
    /// operation of the request they were written for as fields.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormatArg,

    /// Log to syslog instead of stderr.
    #[arg(long)]
    pub syslog: bool,

    /// Set the open-file limit (0 leaves it unchanged; default: raise to the maximum).
    #[arg(long, value_name = "N")]
    pub rlimit_nofile: Option<u64>,

    /// Sandbox, as in virtiofsd: `namespace` (own mount, pid, net, ipc and uts
    /// namespaces, and a user namespace when not root; SharedDir becomes the root by
    /// pivot_root), `chroot` (chroot into SharedDir; root only), or `none`.
    #[arg(long, value_enum, default_value = "namespace")]
    pub sandbox: SandboxMode,

    /// What a system call outside a thread's seccomp allow-list does, as in
    /// virtiofsd: `kill` the daemon, `trap` (log it and exit), `log` it and allow it,
    /// or `none` (no filter).
    #[arg(long, value_enum, default_value = "kill")]
    pub seccomp: SeccompMode,

    /// How nodes refer to host inodes, as in virtiofsd: `never` (an `O_PATH` fd
    /// each), `prefer` (a file handle where the file system makes them, else an fd)
    /// or `mandatory` (file handles only; a share without them is refused). Handles
    /// cost no fd and do not keep unlinked files alive; opening one needs
    /// CAP_DAC_READ_SEARCH (without it `prefer` keeps fds).
    #[arg(long, value_enum, default_value = "never")]
    pub inode_file_handles: FileHandlesArg,

    /// Live migration and snapshots, as in virtiofsd: how the source names each node
    /// the guest holds in the device state, `find-paths` (its path below its volume)
    /// or `file-handles` (its file handle; source and destination must serve the same
    /// file system, and the destination needs CAP_DAC_READ_SEARCH). Paths are kept
    /// with the handles, to check where each handle leads. Ignored on the destination.
    #[arg(long, value_enum, default_value = "find-paths")]
    pub migration_mode: MigrationMode,

    /// What the destination of a migration or restore does with a node, open file
    /// or lock it cannot get back, as in virtiofsd: `abort` the load (the migration
    /// fails and the source runs on), or `guest-error` (the load succeeds; the guest
    /// gets ESTALE for what was lost). Ignored on the source.
    #[arg(long, value_enum, default_value = "abort")]
    pub migration_on_error: OnError,

    /// With find-paths: each node also carries its file handle, and the destination
    /// checks that the path it opens is that very inode (only where both serve the
    /// same file system; not for a restore into a copy). Ignored on the destination.
    #[arg(long)]
    pub migration_verify_handles: bool,

    /// With find-paths: each node's path is opened again when the state is written,
    /// and a node whose path leads elsewhere (renamed by the host meanwhile) is written
    /// without one. Ignored on the destination.
    #[arg(long)]
    pub migration_confirm_paths: bool,

    /// Serve the next frontend after one disconnects, on the same socket, instead of
    /// exiting (a VMM restarted by the platform, a VM powered off and booted again):
    /// the guest session ends as on a device reset; attached volumes stay.
    #[arg(long)]
    pub keep_serving: bool,

    /// Print the vhost-user backend capabilities as JSON and exit.
    #[arg(long)]
    pub print_capabilities: bool,
}

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
    /// `--translate-uid`/`--translate-gid` as given (the device state compares them).
    pub translate_rules: (Vec<String>, Vec<String>),
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

impl Args {
    pub fn into_config(self) -> Result<Config, ConfigError> {
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
        let uids = IdTranslation::parse(IdKind::Uid, &self.translate_uid).map_err(ConfigError)?;
        let gids = IdTranslation::parse(IdKind::Gid, &self.translate_gid).map_err(ConfigError)?;
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
                .map_err(ConfigError)
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
pub fn split_rate_limit(arg: &str) -> Result<(&str, Option<RateLimit>), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut full = vec!["volfsd".to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        super::parse(&full).map_err(|e| match e {
            ParseError::Clap(e) => e.to_string(),
            ParseError::Config(e) => e.0,
        })
    }

    #[test]
    fn allowed_dir_rate_limits_follow_the_access_and_a_comma_in_a_path_stays() {
        let (path, l) =
            split_rate_limit("data:ro,ops_size=1000,bw_size=4096,bw_refill_time_ms=10").unwrap();
        assert_eq!(path, "data:ro");
        let l = l.unwrap();
        assert_eq!(l.ops.unwrap().size, 1000);
        assert_eq!(l.ops.unwrap().refill_time_ms, qos::DEFAULT_REFILL_TIME_MS);
        assert_eq!(l.bandwidth.unwrap().refill_time_ms, 10);
        assert_eq!(split_rate_limit("a,b:rw").unwrap(), ("a,b:rw", None));
        assert_eq!(split_rate_limit("a,b").unwrap(), ("a,b", None));
        let e = split_rate_limit("data,ops_size=0").unwrap_err();
        assert!(e.contains("size must be above 0"), "{e}");
        let e = split_rate_limit("data,ops_refill_time_ms=100").unwrap_err();
        assert!(e.contains("ops: size"), "{e}");
        let e = split_rate_limit("data,ops_size=ten").unwrap_err();
        assert!(e.contains("ops_size"), "{e}");

        let dir = std::env::temp_dir().join(format!("volfsd-cfg-qos-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        let d = dir.to_str().unwrap();
        let c = parse(&[
            "--socket-path",
            "/a",
            "--shared-dir",
            d,
            "--allowed-dir",
            "a:ro,ops_size=5",
        ])
        .unwrap();
        let spec = &c.allowed_dirs.unwrap()[0];
        assert!(spec.read_only);
        assert_eq!(spec.guest, ["a"]);
        assert_eq!(spec.rate_limit.unwrap().ops.unwrap().size, 5);
        let e = parse(&[
            "--socket-path",
            "/a",
            "--shared-dir",
            d,
            "--allowed-dir",
            "a,ops_size=x",
        ])
        .unwrap_err();
        assert!(e.contains("--allowed-dir a,ops_size=x"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn minimal_socket_path() {
        let c = parse(&["--socket-path", "/tmp/x.sock", "--shared-dir", "/tmp"]).unwrap();
        assert_eq!(c.socket, SocketSource::Path("/tmp/x.sock".into()));
        assert_eq!(c.cache, CacheMode::None);
        assert!(!c.readonly);
    }

    #[test]
    fn never_is_none() {
        let c = parse(&["--fd", "3", "--shared-dir", "/tmp", "--cache", "never"]).unwrap();
        assert_eq!(c.cache, CacheMode::None);
        assert_eq!(c.socket, SocketSource::Fd(3));
        let c = parse(&["--fd", "3", "--shared-dir", "/tmp", "--cache=always"]).unwrap();
        assert_eq!(c.cache, CacheMode::Always);
    }

    #[test]
    fn socket_required_exactly_once() {
        let e = parse(&["--shared-dir", "/tmp"]).unwrap_err();
        assert!(e.contains("--socket-path"), "{e}");
        let e = parse(&["--socket-path", "/a", "--fd", "3", "--shared-dir", "/tmp"]).unwrap_err();
        assert!(e.contains("--fd") || e.contains("cannot be used"), "{e}");
    }

    #[test]
    fn shared_dir_must_be_a_directory() {
        let e = parse(&["--socket-path", "/a", "--shared-dir", "/nonexistent/x"]).unwrap_err();
        assert!(e.contains("--shared-dir /nonexistent/x"), "{e}");
        let e = parse(&["--socket-path", "/a", "--shared-dir", "/etc/hostname"]).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn unsupported_virtiofsd_options_are_named() {
        let e = parse(&[
            "--socket-path",
            "/a",
            "--shared-dir",
            "/tmp",
            "--xattrmap=:map::user.virtiofs.:",
        ])
        .unwrap_err();
        assert!(e.contains("'--xattrmap'"), "{e}");
        let e = parse(&["--socket-path", "/a", "-o", "writeback"]).unwrap_err();
        assert!(e.contains("'-o writeback'"), "{e}");
    }

    #[test]
    fn virtiofsd_compat_form_configures_the_same() {
        let c = parse(&["--fd=3", "-o", "source=/tmp,cache=metadata,xattr", "-f"]).unwrap();
        assert_eq!(c.shared_dir, Path::new("/tmp").canonicalize().unwrap());
        assert_eq!((c.cache, c.xattr), (CacheMode::Metadata, true));
        let c = parse(&["--fd=3", "--shared-dir=/tmp", "-o", "xattr,no_xattr"]).unwrap();
        assert!(!c.xattr);
    }

    #[test]
    fn posix_acl_modes_as_virtiofsd_spells_them() {
        let base = ["--fd=3", "--shared-dir=/tmp"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            parse(&v)
        };
        assert_eq!(with(&[]).unwrap().posix_acl, PosixAclArg::Never);
        let c = with(&["--posix-acl"]).unwrap();
        assert_eq!((c.posix_acl, c.xattr), (PosixAclArg::Always, true));
        assert_eq!(
            with(&["--posix-acl=auto"]).unwrap().posix_acl,
            PosixAclArg::Auto
        );
        assert_eq!(
            with(&["-o", "posix_acl"]).unwrap().posix_acl,
            PosixAclArg::Always
        );
        assert!(with(&["--posix-acl=sometimes"]).is_err());
    }

    #[test]
    fn direct_io_and_readdirplus_switches() {
        let c = parse(&["--fd=3", "--shared-dir=/tmp"]).unwrap();
        assert!(!c.allow_direct_io && c.readdirplus);
        let c = parse(&[
            "--fd=3",
            "--shared-dir=/tmp",
            "--allow-direct-io",
            "--no-readdirplus",
        ])
        .unwrap();
        assert!(c.allow_direct_io && !c.readdirplus);
        let c = parse(&[
            "--fd=3",
            "--shared-dir=/tmp",
            "-o",
            "allow_direct_io,no_allow_direct_io",
        ])
        .unwrap();
        assert!(!c.allow_direct_io);
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value_and_lists_keep_every_value() {
        let c = parse(&[
            "--fd=3",
            "--shared-dir=/tmp",
            "--cache=never",
            "--cache=metadata",
            "--translate-uid=map:0:1000:1",
            "--translate-uid=forbid-guest:1:10",
        ])
        .unwrap();
        assert_eq!(c.cache, CacheMode::Metadata);
        assert_eq!(c.uids.to_host(0).unwrap(), 1000);
        assert!(c.uids.to_host(5).is_err());
    }

    #[test]
    fn submounts_are_announced_unless_the_last_word_says_otherwise() {
        let base = ["--fd=3", "--shared-dir=/tmp"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            parse(&v).unwrap().announce_submounts
        };
        assert!(with(&[]));
        assert!(with(&["-o", "announce_submounts"]));
        assert!(!with(&["--no-announce-submounts"]));
        assert!(with(&["--no-announce-submounts", "--announce-submounts"]));
        assert!(!with(&["--announce-submounts", "--no-announce-submounts"]));
    }

    #[test]
    fn migration_flags_have_virtiofsd_meaning() {
        let c = parse(&["--socket-path=/tmp/s", "--shared-dir=/tmp"]).unwrap();
        assert_eq!(c.migration, MigrationOptions::default());
        assert!(!c.keep_serving);
        let c = parse(&[
            "--socket-path=/tmp/s",
            "--shared-dir=/tmp",
            "--migration-mode=file-handles",
            "--migration-on-error=guest-error",
            "--keep-serving",
        ])
        .unwrap();
        assert!(c.warnings.is_empty(), "no longer ignored: {:?}", c.warnings);
        assert_eq!(c.migration.save.mode, MigrationMode::FileHandles);
        assert_eq!(c.migration.load.on_error, OnError::GuestError);
        assert!(c.keep_serving);
        // KubeVirt's spelling, values apart.
        let c = parse(&[
            "--socket-path=/tmp/s",
            "--shared-dir=/tmp",
            "--migration-mode",
            "find-paths",
            "--migration-verify-handles",
            "--migration-confirm-paths",
        ])
        .unwrap();
        assert!(c.migration.save.verify_handles && c.migration.save.confirm_paths);
        let err = |v: &[&str]| parse(v).err().unwrap_or_else(|| panic!("accepted: {v:?}"));
        let e = err(&[
            "--socket-path=/tmp/s",
            "--shared-dir=/tmp",
            "--migration-mode=file-handles",
            "--migration-verify-handles",
        ]);
        assert!(e.contains("--migration-verify-handles"), "{e}");
        let e = err(&[
            "--socket-path=/tmp/s",
            "--shared-dir=/tmp",
            "--migration-mode=teleport",
        ]);
        assert!(e.contains("teleport") && e.contains("find-paths"), "{e}");
    }

    #[test]
    fn sandbox_and_seccomp_default_to_the_strictest() {
        let c = parse(&["--socket-path", "/a", "--shared-dir", "/tmp"]).unwrap();
        assert_eq!(c.sandbox, SandboxMode::Namespace);
        assert_eq!(c.seccomp, SeccompMode::Kill);
        // virtiofsd's spellings, with '=' and without.
        let c = parse(&[
            "--socket-path",
            "/a",
            "--shared-dir",
            "/tmp",
            "--sandbox=chroot",
            "--seccomp",
            "log",
        ])
        .unwrap();
        assert_eq!(
            (c.sandbox, c.seccomp),
            (SandboxMode::Chroot, SeccompMode::Log)
        );
        let e = parse(&[
            "--socket-path",
            "/a",
            "--shared-dir",
            "/tmp",
            "--sandbox",
            "jail",
        ])
        .unwrap_err();
        assert!(e.contains("--sandbox") && e.contains("namespace"), "{e}");
    }

    #[test]
    fn unknown_options_are_named() {
        let e = parse(&["--socket-path", "/a", "--shared-dir", "/tmp", "--bogus"]).unwrap_err();
        assert!(e.contains("--bogus"), "{e}");
    }

    #[test]
    fn socket_paths_are_checked() {
        let long = format!("/tmp/{}", "x".repeat(120));
        let e = parse(&["--socket-path", &long, "--shared-dir", "/tmp"]).unwrap_err();
        assert!(
            e.starts_with("--socket-path /tmp/xxx") && e.contains("107"),
            "{e}"
        );
        let e = parse(&["--socket-path", "/nonexistent/s", "--shared-dir", "/tmp"]).unwrap_err();
        assert!(
            e.contains("--socket-path /nonexistent/s: directory /nonexistent"),
            "{e}"
        );
        let e = parse(&[
            "--socket-path",
            "/tmp/s",
            "--shared-dir",
            "/tmp",
            "--control-socket",
            "/etc/hostname/c",
        ])
        .unwrap_err();
        assert!(
            e.contains("--control-socket /etc/hostname/c: /etc/hostname is not a directory"),
            "{e}"
        );
        assert!(parse(&["--socket-path", "rel.sock", "--shared-dir", "/tmp"]).is_ok());
    }

    #[test]
    fn socket_group_by_name_or_gid() {
        let c = parse(&[
            "--socket-path",
            "/tmp/s",
            "--shared-dir",
            "/tmp",
            "--socket-group",
            "root",
        ])
        .unwrap();
        assert_eq!(c.socket_group, Some(0));
        let c = parse(&[
            "--socket-path=/tmp/s",
            "--shared-dir=/tmp",
            "--socket-group=4321",
        ])
        .unwrap();
        assert_eq!(c.socket_group, Some(4321));
        let e = parse(&[
            "--socket-path=/tmp/s",
            "--shared-dir=/tmp",
            "--socket-group=no-such-grp",
        ])
        .unwrap_err();
        assert!(
            e.contains("--socket-group no-such-grp: no such group"),
            "{e}"
        );
        let e = parse(&["--fd=3", "--shared-dir=/tmp", "--socket-group=root"]).unwrap_err();
        assert!(e.contains("--socket-group"), "{e}");
    }

    #[test]
    fn capabilities_are_fs_with_the_features_volfsd_has() {
        let doc: serde_json::Value = serde_json::from_str(capabilities_json()).unwrap();
        assert_eq!(doc["type"], "fs");
        assert_eq!(
            doc["features"],
            serde_json::json!([
                "migrate-precopy",
                "posix-acl-negotiation-mode",
                "separate-options"
            ])
        );
    }
}
