//! volfsd: a vhost-user virtio-fs backend for MicroVM sandbox platforms.
//!
//! Every module is crate-private: the binary runs [`main`], and the harness, the
//! fuzz targets and the man page generator reach what they need through
//! [`exports`], the one deliberate door, so the compiler reports dead code.

mod cli;
mod config;
mod control;
mod daemon;
mod device;
mod error;
pub mod exports;
mod fs;
mod fuse_ops;
#[cfg(test)]
mod generated_docs;
mod handoff;
mod keeper;
mod logging;
mod metrics;
mod qos;
mod region;
mod sandbox;
mod state;

pub use cli::main;
