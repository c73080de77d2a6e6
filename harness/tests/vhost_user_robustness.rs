//! End-to-end tests, continued from vhost_user.rs: what a broken or hostile
//! frontend does to the daemon (malformed FUSE messages and descriptor chains,
//! requests before INIT, disconnect, SIGTERM), POSIX locks between owners, and an
//! inherited listening socket.
//!
//! Run against the reference implementation with
//! `VOLFSD_TEST_DAEMON=~/.cargo/bin/virtiofsd cargo test --test vhost_user_robustness`;
//! tests that depend on volfsd-specific behaviour say so where they branch.

#[path = "vhost_user_robustness/lifecycle.rs"]
mod lifecycle;
#[path = "vhost_user_robustness/locks.rs"]
mod locks;
#[path = "vhost_user_robustness/malformed.rs"]
mod malformed;
