//! The flags as clap parses them ([`Args`]) and their value enums; `mod.rs`
//! validates them into a [`super::Config`].

use std::os::fd::RawFd;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::device::MAX_REQUEST_QUEUES;
use crate::fs::file_handle::FileHandleMode;
use crate::fs::{AclMode, CacheMode, Limits};
use crate::logging::LogFormat;
use crate::sandbox::{SandboxMode, SeccompMode};
use crate::state::{MigrationMode, OnError};

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

    /// After a queue's ring runs dry, watch it this many microseconds for the next
    /// request before sleeping, while requests keep coming (the drain's first one
    /// came within the window, or it found two): such a request is served without
    /// the guest's kick and the worker's wake-up. An idle queue never polls. 0:
    /// never. The default is
    /// the window measured best here (docs/BENCHMARKS.md, adaptive polling).
    #[arg(long, value_name = "US", default_value_t = 25,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub poll_us: u64,

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

    /// Run a connection keeper above the serving process: it holds the frontend's
    /// connection and relays it, so that the serving process can be replaced under a
    /// running VM (docs/UPGRADE.md). Off by default.
    #[arg(long)]
    pub upgradable: bool,

    /// A serving process started by the keeper for an upgrade: the fd of the private
    /// listener it serves the keeper on (src/keeper/upgrade.rs). Not for users.
    #[arg(long, hide = true)]
    pub keeper_listen_fd: Option<i32>,

    /// With it: the control socket's listening fd, inherited from the keeper.
    #[arg(long, hide = true)]
    pub keeper_control_fd: Option<i32>,

    /// With it: its end of the keeper's channel (`PUT /upgrade`).
    #[arg(long, hide = true)]
    pub keeper_channel_fd: Option<i32>,

    /// With it: the session region's fd (src/region/).
    #[arg(long, hide = true)]
    pub keeper_region_fd: Option<i32>,

    /// With it: the journal half this process records into (0 or 1).
    #[arg(long, hide = true, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub keeper_journal: Option<u32>,

    /// With it, after a crash under a guest's session: the journal half the killed
    /// process recorded into, to serve the guest on from.
    #[arg(long, hide = true, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub keeper_recover: Option<u32>,

    /// With it: the volumes the previous serving process had attached (JSON, as the
    /// control API keeps them): attached first, in place of the command line's.
    #[arg(long, hide = true)]
    pub keeper_volumes: Option<String>,

    /// With it, for an upgrade: a pidfd of the serving process it replaces, the only
    /// peer the guest's lock files are taken from.
    #[arg(long, hide = true)]
    pub keeper_source_pidfd: Option<i32>,

    /// Print the vhost-user backend capabilities as JSON and exit.
    #[arg(long)]
    pub print_capabilities: bool,
}
