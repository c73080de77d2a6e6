//! The private listening socket a serving process the keeper starts accepts the
//! keeper on: bound in a new 0700 directory (`mkdtemp`) under the daemon's temp
//! directory, so that only the daemon's own user (or root) can reach it, who can
//! already trace the daemon; removed with its directory when it is no longer needed.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use super::Error;

/// The private listening socket a serving process accepts the keeper on.
pub struct Private {
    pub listener: UnixListener,
    pub path: PathBuf,
}

impl Private {
    pub fn bind() -> Result<Private, Error> {
        let template = std::env::temp_dir().join("volfsd-keeper.XXXXXX");
        let dir = nix::unistd::mkdtemp(&template)
            .map_err(|e| Error::io("making the keeper's directory", e.into()))?;
        let path = dir.join("serve.sock");
        let listener = UnixListener::bind(&path).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            Error::io("binding the keeper's socket", e)
        })?;
        Ok(Private { listener, path })
    }

    pub fn remove(path: &Path) {
        let _ = std::fs::remove_file(path);
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_private_socket_is_in_a_directory_of_its_own_that_remove_takes_away() {
        let p = Private::bind().unwrap();
        let dir = p.path.parent().unwrap().to_path_buf();
        assert!(dir.starts_with(std::env::temp_dir()), "{}", dir.display());
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // The keeper connects; the serving process accepts.
        let _keeper = UnixStream::connect(&p.path).unwrap();
        p.listener.accept().unwrap();
        let other = Private::bind().unwrap();
        assert_ne!(other.path, p.path);
        Private::remove(&p.path);
        assert!(!dir.exists());
        assert!(other.path.exists(), "another one stays");
        Private::remove(&other.path);
        // Removing it twice is harmless.
        Private::remove(&p.path);
    }
}
