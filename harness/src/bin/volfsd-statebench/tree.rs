//! The share a run serves: N empty files in directories of `PER_DIR`, made once and
//! reused while its marker says it is whole.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Error, Res};

/// Files per directory of the tree.
pub(crate) const PER_DIR: usize = 1000;

pub(crate) fn dir_name(d: usize) -> String {
    format!("d{d:05}")
}

pub(crate) fn file_name(f: usize) -> String {
    format!("f{f:03}")
}

/// (directory index, file index in it) of file `i`.
pub(crate) fn place(i: usize) -> (usize, usize) {
    (i / PER_DIR, i % PER_DIR)
}

pub(crate) fn share_of(tree: &Path, nodes: usize) -> PathBuf {
    tree.join(format!("n{nodes}"))
}

/// Makes the tree unless its marker says it is whole; returns the share.
pub(crate) fn make_tree(tree: &Path, nodes: usize) -> Res<PathBuf> {
    let share = share_of(tree, nodes);
    let marker = tree.join(format!("n{nodes}.complete"));
    if fs::read_to_string(&marker).is_ok_and(|s| s.trim() == nodes.to_string()) {
        return Ok(share);
    }
    eprintln!(
        "statebench: making {} ({nodes} empty files)",
        share.display()
    );
    let start = Instant::now();
    let _ = fs::remove_file(&marker);
    if share.exists() {
        fs::remove_dir_all(&share).map_err(Error::file(Some("removing"), &share))?;
    }
    fs::create_dir_all(&share).map_err(Error::file(Some("creating"), &share))?;
    for i in 0..nodes {
        let (d, f) = place(i);
        let dir = share.join(dir_name(d));
        if f == 0 {
            fs::create_dir(&dir).map_err(Error::file(Some("creating"), &dir))?;
        }
        let p = dir.join(file_name(f));
        File::create(&p).map_err(Error::file(Some("creating"), &p))?;
    }
    // SAFETY: sync has no preconditions. The tree's metadata reaches the disk now,
    // not during a measurement.
    unsafe { libc::sync() };
    fs::write(&marker, format!("{nodes}\n")).map_err(Error::file(Some("writing"), &marker))?;
    eprintln!(
        "statebench: made {} in {:.1} s",
        share.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(share)
}
