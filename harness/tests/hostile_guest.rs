//! The hostile-guest suite: one test per attack from docs/SECURITY.md, each named
//! after the attack it tries. The project's vhost-user frontend stands in for a
//! malicious guest kernel (or, for socket and log attacks, a local user).
//!
//! Run it against the reference daemon with
//! `VOLFSD_TEST_DAEMON=~/.cargo/bin/virtiofsd cargo test --test hostile_guest`:
//! tests that need volfsd-only features (allowed dirs, the control socket) say so.

#[path = "hostile_guest/credentials.rs"]
mod credentials;
#[path = "hostile_guest/detach.rs"]
mod detach;
#[path = "hostile_guest/forged_ids.rs"]
mod forged_ids;
#[path = "hostile_guest/limits.rs"]
mod limits;
#[path = "hostile_guest/loaded_sessions.rs"]
mod loaded_sessions;
#[path = "hostile_guest/logs.rs"]
mod logs;
#[path = "hostile_guest/queues.rs"]
mod queues;
#[path = "hostile_guest/readonly.rs"]
mod readonly;
#[path = "hostile_guest/requests.rs"]
mod requests;
#[path = "hostile_guest/sessions.rs"]
mod sessions;
#[path = "hostile_guest/sockets.rs"]
mod sockets;
#[path = "hostile_guest/special_files.rs"]
mod special_files;
#[path = "hostile_guest/translated_ids.rs"]
mod translated_ids;
