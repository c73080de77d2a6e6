//! A socket file removed by its path: one a dead serving process or a set-up that
//! failed after the bind left behind. The supervisor, the keeper and the daemon's
//! start-up remove theirs so; never any other kind of file.

use std::path::Path;

/// Removes a socket left behind (by a dead child, or a set-up that failed after the
/// bind); never any other kind of file.
pub fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
}
