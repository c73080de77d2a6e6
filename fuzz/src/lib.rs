//! volfsd's fuzz targets as plain functions, shared by the AFL binaries
//! (`src/bin/fuzz_*.rs`) and the replay test (`tests/replay.rs`).
//!
//! Each `run_*` panics when its oracle fails; see each module for the input format
//! and the oracle.

pub mod common;
pub mod control;
pub mod fuse;
pub mod paths;
pub mod region;
pub mod state;
pub mod virtqueue;

pub use control::run_control;
pub use fuse::run_fuse;
pub use paths::run_paths;
pub use region::run_region;
pub use state::run_state;
pub use virtqueue::run_virtqueue;

/// Every target: (name, function). The name is the corpus directory
/// (`corpus/NAME`), the regression directory (`regressions/NAME`) and the binary
/// (`fuzz_NAME`).
/// A target's entry point.
pub type Target = fn(&[u8]);

pub const TARGETS: &[(&str, Target)] = &[
    ("fuse", run_fuse),
    ("virtqueue", run_virtqueue),
    ("control", run_control),
    ("paths", run_paths),
    ("state", run_state),
    ("region", run_region),
];
