//! The hostile-guest suite: one test per attack from docs/SECURITY.md, each named
//! after the attack it tries. The project's vhost-user frontend stands in for a
//! malicious guest kernel (or, for socket and log attacks, a local user).
//!
//! Run it against the reference daemon with
//! `VOLFSD_TEST_DAEMON=~/.cargo/bin/virtiofsd cargo test --test hostile_guest`:
//! tests that need volfsd-only features (allowed dirs, the control socket) say so.

mod common;

#[path = "hostile_guest/logs.rs"]
mod logs;
#[path = "hostile_guest/sockets.rs"]
mod sockets;
