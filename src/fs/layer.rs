//! `fs_layer!`: a layer's `FileSystem` and `ExtraOps` implementations, generated from
//! the one list of operations (`ops.rs`). The layer names a rule for the operations
//! it treats alike, and a line for each one it treats differently:
//!
//! ```text
//! fs_layer! {
//!     self: MyLayer => inner;
//!     others = pass;
//!     getattr(_, inode, ..) = route => Ok(self.attr_of(inode));
//!     mkdir, unlink = route => Err(refuse());
//! }
//! ```
//! A line's pattern (`(_, inode, ..)`) binds the operation's arguments by position,
//! so the expression after `=>` can use them (the list's own parameter names are
//! out of its reach: macro hygiene); without a pattern it uses none. A line whose
//! name the list lacks fails the build.
//!
//! The rules for the others:
//! - `pass`: straight to `self.inner`;
//! - `inherent`: the layer's own inherent method of the same name (the passthrough
//!   layer, whose operations live in one file per topic);
//! - `guard`: through the layer's `guard(op, node, mutates, run)` as the list's
//!   `read`/`write` column says (the read-only guard: refuse, count; `op` is the
//!   method's `metrics::Op`); a second written node goes through
//!   `refuse_if_read_only` first. Operations on no node pass.
//!
//! The rules of a line:
//! - `route => expr`: `expr` when the operation's node is one of the layer's own
//!   (`self.owns(node)`: the virtual directories) and names one that exists
//!   (`self.own_exists(node, errno)`, ENOENT if not, or the errno given as
//!   `route(errno)`), else to `self.inner`;
//! - `own => expr`: `expr` always.

macro_rules! fs_layer {
    (
        $s:ident : $layer:ty $(=> $inner:ident)?;
        others = $default:ident;
        $(
            $($op:ident),+ $(($($pat:tt)*))? = $rule:ident $(($($rarg:expr),*))?
                => $body:expr;
        )*
    ) => {
        // `$` for the macro below, which a macro cannot write itself.
        $crate::fs::layer::fs_layer!(@rules ($) $s, $layer, [$($inner)?], $default,
            $( [$($op),+] [$($($pat)*)?] $rule [$($($rarg),*)?] {$body} )*);
    };
    // The layer's lines become the arms of a local macro, `layer_rule!`, which the
    // generated methods call with their operation's name: a listed operation meets
    // its line, any other the layer's rule for the others.
    (@rules ($d:tt) $s:ident, $layer:ty, $inner:tt, $default:ident,
        $( [$($op:ident),+] $pat:tt $rule:ident $rargs:tt {$body:expr} )*
    ) => {
        // A line whose name is no operation of the list is never used: an error.
        #[deny(unused_macro_rules)]
        macro_rules! layer_rule {
            $($(
                ($op $d params:tt $d ret:tt $d args:tt $d($d facts:tt)*) => {
                    $crate::fs::layer::fs_layer!(@fn $s, $op $d params $d ret {
                        $crate::fs::layer::fs_layer!(@rule $rule $rargs, $s, $inner, $op,
                            $d args, $pat, {$body}, [$d($d facts)*])
                    });
                };
            )+)*
            ($d name:ident $d params:tt $d ret:tt $d args:tt $d($d facts:tt)*) => {
                $crate::fs::layer::fs_layer!(@fn $s, $d name $d params $d ret {
                    $crate::fs::layer::fs_layer!(@rule $default [], $s, $inner, $d name,
                        $d args, [], {()}, [$d($d facts)*])
                });
            };
        }
        $crate::fs::ops::for_each_op! {
            $crate::fs::layer::fs_layer { @impl $layer, layer_rule, }
        }
    };
    (@impl $layer:ty, $rules:ident, fuse { $($fuse:tt)* } extra { $($extra:tt)* }) => {
        // The list's names, in scope for the generated methods and the layer's lines.
        const _: () = {
            use $crate::fs::ops::prelude::*;
            impl FileSystem for $layer {
                type Inode = u64;
                type Handle = u64;
                $crate::fs::layer::fs_layer!(@methods $rules, $($fuse)*);
            }
            impl ExtraOps for $layer {
                $crate::fs::layer::fs_layer!(@methods $rules, $($extra)*);
            }
        };
    };
    (@methods $rules:ident, $(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)?
            $(= $kind:ident($($fact:expr),*))?;
    )*) => {
        $(
            $rules! { $name ($($arg: $ty),*) ($(-> $ret)?) ($($arg),*) $($kind($($fact),*))? }
        )*
    };
    // One method. Its `self` comes from where the layer's lines are written, as the
    // `self` they use must (a macro's own `self` is another name).
    (@fn $s:ident, $name:ident ($($params:tt)*) ($($ret:tt)*) $body:block) => {
        #[allow(unused_variables, clippy::too_many_arguments)]
        fn $name(&$s, $($params)*) $($ret)* $body
    };

    // The rules. Each gets: the layer's `self` and inner field, the operation's name
    // and arguments, the line's pattern and expression, and the list's column.
    (@rule pass [], $s:ident, [$inner:ident], $name:ident, ($($a:ident),*),
        $pat:tt, $body:tt, $facts:tt) => {
        $s.$inner.$name($($a),*)
    };
    (@rule inherent [], $s:ident, $inner:tt, $name:ident, ($($a:ident),*),
        $pat:tt, $body:tt, $facts:tt) => {
        Self::$name($s, $($a),*)
    };
    (@rule guard [], $s:ident, $inner:tt, $name:ident, $args:tt, $pat:tt, $body:tt, []) => {
        $crate::fs::layer::fs_layer!(@rule pass [], $s, $inner, $name, $args, [], {()}, [])
    };
    (@rule guard [], $s:ident, [$inner:ident], $name:ident, ($($a:ident),*),
        $pat:tt, $body:tt, [$kind:ident($node:expr $(, $more:expr)?)]) => {{
        $crate::fs::layer::fs_layer!(@second $s, $kind $(, $more)?);
        $s.guard(
            $crate::metrics::Op::$name,
            $node,
            $crate::fs::layer::fs_layer!(@mutates $kind $(, $more)?),
            || $s.$inner.$name($($a),*),
        )
    }};
    (@rule own [], $s:ident, $inner:tt, $name:ident, $args:tt,
        [$($pat:tt)*], {$body:expr}, $facts:tt) => {{
        $crate::fs::layer::fs_layer!(@bind [$($pat)*] $args);
        $body
    }};
    (@rule route [$($missing:expr)?], $s:ident, [$inner:ident], $name:ident,
        ($($a:ident),*), [$($pat:tt)*], {$body:expr},
        [$kind:ident($node:expr $(, $more:expr)?)]) => {
        if $s.owns($node) {
            // An id in the layer's range that names nothing is answered as one.
            match $s.own_exists($node, $crate::fs::layer::fs_layer!(@missing $($missing)?)) {
                Ok(()) => {
                    $crate::fs::layer::fs_layer!(@bind [$($pat)*] ($($a),*));
                    $body
                }
                Err(e) => Err(e),
            }
        } else {
            $s.$inner.$name($($a),*)
        }
    };

    // Helpers of the rules.
    (@bind [] $args:tt) => {};
    (@bind [$($pat:tt)+] ($($a:ident),*)) => {
        let ($($pat)+) = ($($a,)*);
    };
    (@missing) => { libc::ENOENT };
    (@missing $errno:expr) => { $errno };
    (@mutates read) => { false };
    (@mutates write $(, $other:expr)?) => { true };
    (@mutates write_if, $cond:expr) => { $cond };
    (@second $s:ident, write, $other:expr) => { $s.refuse_if_read_only($other)? };
    (@second $s:ident, $kind:ident $(, $more:expr)?) => {};
}

pub(crate) use fs_layer;
