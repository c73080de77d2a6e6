//! `fs_layer!`: the `FileSystem` implementation of a layer that wraps another, written
//! as one line per operation saying what the layer does with it, instead of a
//! hand-written pass-through of every method (after virtiofsd's `ops_allow!`).
//!
//! ```text
//! fs_layer! {
//!     self: MyLayer => inner;
//!     fn lookup(ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> = pass;
//!     fn mkdir(..) -> io::Result<Entry> = write(parent);
//! }
//! ```
//! The rules:
//! - `pass`: straight to `self.inner`;
//! - `read(node)` / `write(node)` / `write_if(node, cond)`: through the layer's
//!   `guard(op, node, mutates, run)` (the read-only guard: refuse, count; `op` is the
//!   method's `metrics::Op`);
//! - `route(node) => expr`: `expr` when `node` is one of the layer's own
//!   (`self.owns(node)`: the virtual directories) and names one that exists
//!   (`self.own_exists(node, errno)`, ENOENT if not, or the errno given as
//!   `route(node, errno)`), else to `self.inner`;
//! - `own => expr`: `expr` always;
//! - `inherent`: the layer's own inherent method of the same name (the passthrough
//!   layer, whose operations live in one file per topic).
//!
//! Methods not listed keep the trait's default (ENOSYS): IOCTL, BMAP, POLL and the
//! DAX mappings, which volfsd does not serve.

macro_rules! fs_layer {
    (
        $s:ident : $layer:ty => $inner:ident;
        $(
            fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)?
                = $rule:ident $(($($rarg:expr),*))? $(=> $alt:expr)?;
        )*
    ) => {
        impl fuse_backend_rs::api::filesystem::FileSystem for $layer {
            type Inode = u64;
            type Handle = u64;
            $(
                #[allow(unused_variables, clippy::too_many_arguments)]
                fn $name(&$s, $($arg: $ty),*) $(-> $ret)? {
                    fs_layer!(@rule $s, $inner, $name, ($($arg),*),
                        $rule $(($($rarg),*))? $(=> $alt)?)
                }
            )*
        }
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*), pass) => {
        $s.$inner.$name($($arg),*)
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*), inherent) => {
        Self::$name($s, $($arg),*)
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*), own => $alt:expr) => {
        $alt
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*),
        route($node:expr) => $alt:expr) => {
        fs_layer!(@rule $s, $inner, $name, ($($arg),*), route($node, libc::ENOENT) => $alt)
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*),
        route($node:expr, $missing:expr) => $alt:expr) => {
        if $s.owns($node) {
            // An id in the layer's range that names nothing is answered as one.
            match $s.own_exists($node, $missing) {
                Ok(()) => $alt,
                Err(e) => Err(e),
            }
        } else {
            $s.$inner.$name($($arg),*)
        }
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*), read($node:expr)) => {
        $s.guard($crate::metrics::Op::$name, $node, false, || $s.$inner.$name($($arg),*))
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*), write($node:expr)) => {
        $s.guard($crate::metrics::Op::$name, $node, true, || $s.$inner.$name($($arg),*))
    };
    (@rule $s:ident, $inner:ident, $name:ident, ($($arg:ident),*),
        write_if($node:expr, $cond:expr)) => {
        $s.guard($crate::metrics::Op::$name, $node, $cond, || $s.$inner.$name($($arg),*))
    };
}

pub(crate) use fs_layer;
