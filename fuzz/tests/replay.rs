//! The regression suite: replays every committed corpus file and every file under
//! `regressions/<target>/` through the same functions the AFL binaries run.
//! Needs root (open_tree for the shares), like volfsd's own tests.
//!
//! `regressions/<target>/open/` holds findings whose fix is not in yet: they are
//! not replayed here (one aborts the process); replay them with
//! `cargo run --release --bin replay -- TARGET regressions/TARGET/open/*`, and move
//! each up one directory once fixed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.file_name().is_none_or(|n| n != "README.md"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// One target at a time: the fd oracle of `fuse` looks at every fd of the process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn replay(target: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_, run) = volfsd_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .expect("known target");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = inputs(&root.join("corpus").join(target));
    assert!(!corpus.is_empty(), "corpus/{target} has no seeds");
    let regressions = inputs(&root.join("regressions").join(target));
    for p in corpus.iter().chain(&regressions) {
        let data = std::fs::read(p).unwrap();
        eprintln!("{target}: {}", p.display());
        run(&data);
    }
}

#[test]
fn replay_fuse() {
    replay("fuse");
}

#[test]
fn replay_virtqueue() {
    replay("virtqueue");
}

#[test]
fn replay_control() {
    replay("control");
}

#[test]
fn replay_paths() {
    replay("paths");
}

#[test]
fn replay_state() {
    replay("state");
}

#[test]
fn replay_region() {
    replay("region");
}
