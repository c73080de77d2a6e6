//! volfsd: a vhost-user virtio-fs backend for MicroVM sandbox platforms.

pub mod config;
pub mod control;
pub mod daemon;
pub mod device;
pub mod fs;
pub mod keeper;
pub mod logging;
pub mod metrics;
pub mod qos;
pub mod sandbox;
pub mod state;
