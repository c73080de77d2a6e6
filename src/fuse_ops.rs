//! Every FUSE operation, one row each: who decodes it, how the transport admits it,
//! whether it owes a reply, and the name it is counted under. Routing
//! (`fs/server.rs`), admission (`fs/request.rs`), the metrics (`metrics/`) and
//! docs/fuse-coverage.md all read the row; adding an operation is one row here and
//! its handler (an arm of `fs/dispatch.rs` for one volfsd decodes, nothing more for
//! one fuse-backend-rs's server does). An opcode without a row is answered by that
//! server (ENOSYS).
//!
//! A leaf: it names what the other modules do, and imports none of them.

/// Who decodes a request and writes its reply.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Decoder {
    /// The session's own bookkeeping (`fs/server.rs`): INIT and DESTROY.
    Session,
    /// volfsd, from the request's one local copy, the reply written straight into
    /// the guest's buffers (`fs/dispatch.rs`).
    Volfsd,
    /// fuse-backend-rs 0.14's `Server`, through a writer of its own.
    Library,
    /// Answered with this errno without looking at the body.
    Refused(i32),
}

/// How the transport admits a request before it is served.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Admission {
    /// Served now, or held back while its volume is over its rate limit.
    Throttled,
    /// Never held back: it frees what the guest holds, cancels a wait, or belongs to
    /// the session.
    NeverThrottled,
    /// May block for any time (SETLKW): served off the ring, on a thread of its own.
    MayWait,
}

/// What a successor does with a request a killed serving process had taken and not
/// answered (a request that owes no reply is dropped, whatever this says).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Rerun {
    /// Run again: it changes nothing, or the same again changes nothing more.
    Yes,
    /// Answered EIO: it may have been applied already (creates, removes, renames,
    /// attribute changes).
    No,
    /// Its arguments tell (`fs/request.rs`): a WRITE that appends, an OPEN that
    /// truncates are not run again.
    ByArgs,
}

/// One FUSE operation.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub name: &'static str,
    pub opcode: u32,
    pub decoder: Decoder,
    pub admission: Admission,
    /// Whether the guest waits for a reply (FORGET, BATCH_FORGET, INTERRUPT and
    /// NOTIFY_REPLY owe none).
    pub reply: bool,
    /// After a crash of the process that had taken it.
    pub rerun: Rerun,
    /// The `op` label it is counted under per volume (None: not counted).
    pub metric: Option<Op>,
}

/// Declares the table: [`ROWS`], the [`opcode`] constants and [`Op`] (one variant
/// per `new` metric, in row order).
macro_rules! fuse_ops {
    ($(
        $name:ident = $code:literal, $dec:ident $(($errno:expr))?, $adm:ident, $reply:ident,
            $rerun:ident, $mkind:ident $($metric:ident)?;
    )*) => {
        /// The opcodes, by their FUSE names (every one, whether the code names it or not).
        #[allow(dead_code)]
        pub mod opcode {
            $(pub const $name: u32 = $code;)*
        }

        /// Every row, in opcode order.
        pub const ROWS: &[Row] = &[$(
            Row {
                name: stringify!($name),
                opcode: $code,
                decoder: Decoder::$dec $(($errno))?,
                admission: Admission::$adm,
                reply: fuse_ops!(@reply $reply),
                rerun: Rerun::$rerun,
                metric: fuse_ops!(@metric $mkind $($metric)?),
            },
        )*];

        fuse_ops!(@enum [] $($mkind $($metric)?,)*);
    };
    (@reply reply) => { true };
    (@reply no_reply) => { false };
    (@metric new $m:ident) => { Some(Op::$m) };
    (@metric as $m:ident) => { Some(Op::$m) };
    (@metric none) => { None };
    // The metrics' names: the `new` ones, in order.
    (@enum [$($acc:ident,)*]) => {
        /// The operations counted per volume, named as the `op` label shows them. The
        /// names are fuse-backend-rs's `FileSystem` method names (and volfsd's
        /// `ExtraOps`'), so that the layer generated from that list (`fs/layer.rs`)
        /// counts each method under its own.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, Eq, PartialEq)]
        #[repr(usize)]
        pub enum Op {
            $($acc),*
        }

        impl Op {
            pub const ALL: [Op; [$(Op::$acc),*].len()] = [$(Op::$acc),*];

            /// The `op` label.
            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$acc => stringify!($acc)),*
                }
            }
        }
    };
    (@enum [$($acc:ident,)*] new $m:ident, $($rest:tt)*) => {
        fuse_ops!(@enum [$($acc,)* $m,] $($rest)*);
    };
    (@enum [$($acc:ident,)*] as $m:ident, $($rest:tt)*) => {
        fuse_ops!(@enum [$($acc,)*] $($rest)*);
    };
    (@enum [$($acc:ident,)*] none, $($rest:tt)*) => {
        fuse_ops!(@enum [$($acc,)*] $($rest)*);
    };
}

fuse_ops! {
    // name         opcode  decoder             admission       reply     rerun   metric
    LOOKUP          = 1,  Volfsd,             Throttled,      reply,    Yes,    new lookup;
    FORGET          = 2,  Volfsd,             NeverThrottled, no_reply, No,     none;
    GETATTR         = 3,  Volfsd,             Throttled,      reply,    Yes,    new getattr;
    SETATTR         = 4,  Volfsd,             Throttled,      reply,    No,     new setattr;
    READLINK        = 5,  Library,            Throttled,      reply,    Yes,    new readlink;
    SYMLINK         = 6,  Library,            Throttled,      reply,    No,     new symlink;
    MKNOD           = 8,  Library,            Throttled,      reply,    No,     new mknod;
    MKDIR           = 9,  Volfsd,             Throttled,      reply,    No,     new mkdir;
    UNLINK          = 10, Volfsd,             Throttled,      reply,    No,     new unlink;
    RMDIR           = 11, Volfsd,             Throttled,      reply,    No,     new rmdir;
    RENAME          = 12, Volfsd,             Throttled,      reply,    No,     new rename;
    LINK            = 13, Library,            Throttled,      reply,    No,     new link;
    OPEN            = 14, Volfsd,             Throttled,      reply,    ByArgs, new open;
    READ            = 15, Volfsd,             Throttled,      reply,    Yes,    new read;
    WRITE           = 16, Volfsd,             Throttled,      reply,    ByArgs, new write;
    STATFS          = 17, Volfsd,             Throttled,      reply,    Yes,    new statfs;
    RELEASE         = 18, Volfsd,             Throttled,      reply,    Yes,    new release;
    FSYNC           = 20, Volfsd,             Throttled,      reply,    Yes,    new fsync;
    SETXATTR        = 21, Library,            Throttled,      reply,    No,     new setxattr;
    GETXATTR        = 22, Library,            Throttled,      reply,    Yes,    new getxattr;
    LISTXATTR       = 23, Library,            Throttled,      reply,    Yes,    new listxattr;
    REMOVEXATTR     = 24, Library,            Throttled,      reply,    No,     new removexattr;
    FLUSH           = 25, Volfsd,             Throttled,      reply,    Yes,    new flush;
    INIT            = 26, Session,            NeverThrottled, reply,    Yes,    none;
    OPENDIR         = 27, Volfsd,             Throttled,      reply,    Yes,    new opendir;
    READDIR         = 28, Volfsd,             Throttled,      reply,    Yes,    new readdir;
    RELEASEDIR      = 29, Volfsd,             Throttled,      reply,    Yes,    new releasedir;
    FSYNCDIR        = 30, Volfsd,             Throttled,      reply,    Yes,    new fsyncdir;
    GETLK           = 31, Library,            Throttled,      reply,    Yes,    new getlk;
    SETLK           = 32, Library,            Throttled,      reply,    Yes,    new setlk;
    SETLKW          = 33, Volfsd,             MayWait,        reply,    Yes,    new setlkw;
    ACCESS          = 34, Volfsd,             Throttled,      reply,    Yes,    new access;
    CREATE          = 35, Volfsd,             Throttled,      reply,    No,     new create;
    INTERRUPT       = 36, Library,            NeverThrottled, no_reply, No,     none;
    BMAP            = 37, Library,            Throttled,      reply,    Yes,    none;
    DESTROY         = 38, Session,            NeverThrottled, reply,    Yes,    none;
    IOCTL           = 39, Refused(libc::ENOTTY), Throttled,   reply,    No,     none;
    POLL            = 40, Library,            Throttled,      reply,    Yes,    none;
    NOTIFY_REPLY    = 41, Library,            NeverThrottled, no_reply, No,     none;
    BATCH_FORGET    = 42, Volfsd,             NeverThrottled, no_reply, No,     none;
    FALLOCATE       = 43, Library,            Throttled,      reply,    No,     new fallocate;
    READDIRPLUS     = 44, Volfsd,             Throttled,      reply,    Yes,    new readdirplus;
    RENAME2         = 45, Volfsd,             Throttled,      reply,    No,     as rename;
    LSEEK           = 46, Library,            Throttled,      reply,    Yes,    new lseek;
    COPY_FILE_RANGE = 47, Volfsd,             Throttled,      reply,    No,     new copy_file_range;
    SETUPMAPPING    = 48, Library,            Throttled,      reply,    No,     none;
    REMOVEMAPPING   = 49, Library,            Throttled,      reply,    No,     none;
    SYNCFS          = 50, Volfsd,             Throttled,      reply,    Yes,    new syncfs;
    TMPFILE         = 51, Volfsd,             Throttled,      reply,    No,     new tmpfile;
}

/// Opcodes run from 1 to 51: a row's index by opcode, made once at compile time.
const INDEX_LEN: usize = 64;
const INDEX: [u8; INDEX_LEN] = {
    let mut index = [u8::MAX; INDEX_LEN];
    let mut i = 0;
    while i < ROWS.len() {
        index[ROWS[i].opcode as usize] = i as u8;
        i += 1;
    }
    index
};

/// The row of `opcode` (None: an opcode volfsd has no row for).
pub fn row(opcode: u32) -> Option<&'static Row> {
    let i = *INDEX.get(opcode as usize)?;
    ROWS.get(usize::from(i))
}

/// Whether the guest waits for a reply to `opcode` (an unknown one: it does, and
/// gets ENOSYS).
pub fn expects_reply(opcode: u32) -> bool {
    row(opcode).is_none_or(|r| r.reply)
}

/// The table of docs/fuse-coverage.md: each row as the code has it.
#[cfg(test)]
fn markdown_table() -> String {
    let mut out = String::from(
        "| request | opcode | decoded by | admission | reply | after a crash | counted as |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in ROWS {
        let decoder = match r.decoder {
            Decoder::Session => "volfsd (the session: `server.rs`)".to_string(),
            Decoder::Volfsd => "volfsd (`dispatch.rs`)".to_string(),
            Decoder::Library => "fuse-backend-rs's `Server`".to_string(),
            Decoder::Refused(e) => format!(
                "answered {} undecoded",
                std::io::Error::from_raw_os_error(e)
                    .to_string()
                    .split(" (os error")
                    .next()
                    .unwrap_or("")
            ),
        };
        let admission = match r.admission {
            Admission::Throttled => "rate-limited",
            Admission::NeverThrottled => "never held back",
            Admission::MayWait => "may wait (own thread)",
        };
        let rerun = match (r.reply, r.rerun) {
            (false, _) => "dropped",
            (true, Rerun::Yes) => "run again",
            (true, Rerun::No) => "EIO",
            (true, Rerun::ByArgs) => "by its arguments",
        };
        out.push_str(&format!(
            "| {} | {} | {decoder} | {admission} | {} | {rerun} | {} |\n",
            r.name,
            r.opcode,
            if r.reply { "yes" } else { "no" },
            r.metric.map_or("-", |m| m.name()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_table_is_current() {
        crate::generated_docs::keep_current(
            "docs/fuse-coverage.md",
            "<!-- BEGIN OPERATIONS TABLE (generated from src/fuse_ops.rs) -->\n",
            "<!-- END OPERATIONS TABLE -->",
            &markdown_table(),
        );
    }

    #[test]
    fn each_opcode_has_one_row_in_order_and_every_row_is_found() {
        for pair in ROWS.windows(2) {
            assert!(pair[0].opcode < pair[1].opcode, "{pair:?}");
        }
        for r in ROWS {
            assert_eq!(row(r.opcode).map(|f| f.name), Some(r.name));
        }
        assert!(row(0).is_none() && row(7).is_none() && row(4096).is_none());
        assert!(row(u32::MAX).is_none());
    }

    #[test]
    fn the_opcodes_are_linuxs() {
        use fuse_backend_rs::abi::fuse_abi::Opcode;
        for (name, ours, theirs) in [
            ("LOOKUP", opcode::LOOKUP, Opcode::Lookup as u32),
            ("WRITE", opcode::WRITE, Opcode::Write as u32),
            ("INIT", opcode::INIT, Opcode::Init as u32),
            ("SETLKW", opcode::SETLKW, Opcode::Setlkw as u32),
            (
                "BATCH_FORGET",
                opcode::BATCH_FORGET,
                Opcode::BatchForget as u32,
            ),
            (
                "READDIRPLUS",
                opcode::READDIRPLUS,
                Opcode::Readdirplus as u32,
            ),
            ("RENAME2", opcode::RENAME2, Opcode::Rename2 as u32),
            ("LSEEK", opcode::LSEEK, Opcode::Lseek as u32),
            (
                "COPY_FILE_RANGE",
                opcode::COPY_FILE_RANGE,
                Opcode::CopyFileRange as u32,
            ),
            (
                "REMOVEMAPPING",
                opcode::REMOVEMAPPING,
                Opcode::RemoveMapping as u32,
            ),
        ] {
            assert_eq!(ours, theirs, "{name}");
        }
    }

    #[test]
    fn what_owes_no_reply_is_never_held_back_and_only_setlkw_waits() {
        for r in ROWS {
            if !r.reply {
                assert_eq!(r.admission, Admission::NeverThrottled, "{}", r.name);
            }
            assert_eq!(
                r.admission == Admission::MayWait,
                r.opcode == opcode::SETLKW,
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn metric_names_are_unique_and_each_is_some_rows() {
        let mut names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        for op in Op::ALL {
            assert!(ROWS.iter().any(|r| r.metric == Some(op)), "{}", op.name());
        }
    }
}
