//! The test harness of volfsd: everything that drives the daemon from the outside and
//! never runs in production.
//!
//! - [`frontend`]: a vhost-user-fs frontend (VMM + guest virtio-fs driver),
//! - [`loadgen`]: the load generator behind `volfsd-loadgen`,
//! - [`fixtures`]: what the integration tests share (temp shares, the daemon under
//!   test, host-side probes, a control-socket client).

pub mod fixtures;
pub mod frontend;
pub mod loadgen;
