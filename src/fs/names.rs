//! Names from outside: FUSE names from the guest (one path component each) and
//! volume names from the platform.

use std::ffi::CStr;
use std::io;

use super::sys::errno;

/// The platform's volume-name rule, which every component of a volume's guest path
/// follows (`--allowed-dir`, `PUT /volumes/{name}`).
pub const VOLUME_NAME_RULE: &str = "^[a-zA-Z0-9_-]{1,128}$";

/// Whether `name` follows [`VOLUME_NAME_RULE`].
pub fn valid_volume_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Validates a name from the guest as one path component, with Linux's errnos.
pub fn check_name(name: &CStr) -> io::Result<()> {
    let bytes = name.to_bytes();
    if bytes.is_empty() {
        return Err(errno(libc::ENOENT));
    }
    if bytes.len() > libc::NAME_MAX as usize {
        return Err(errno(libc::ENAMETOOLONG));
    }
    if bytes.contains(&b'/') {
        return Err(errno(libc::EINVAL));
    }
    Ok(())
}

pub fn is_dot_or_dotdot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// Validates a name that will create or remove an entry: `.` and `..` cannot be one;
/// they get `err_for_dots`, the errno Linux gives for that operation.
pub fn check_entry_name(name: &CStr, err_for_dots: libc::c_int) -> io::Result<()> {
    check_name(name)?;
    if is_dot_or_dotdot(name) {
        return Err(errno(err_for_dots));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names() {
        assert!(valid_volume_name("data-1_A"));
        assert!(valid_volume_name(&"a".repeat(128)));
        for bad in ["", "a/b", ".", "..", "a b", "é", &"a".repeat(129)] {
            assert!(!valid_volume_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn guest_names_get_linux_errnos() {
        let e = |n: &CStr| check_name(n).unwrap_err().raw_os_error();
        assert_eq!(e(c""), Some(libc::ENOENT));
        assert_eq!(e(c"a/b"), Some(libc::EINVAL));
        let long = std::ffi::CString::new("x".repeat(256)).unwrap();
        assert_eq!(e(&long), Some(libc::ENAMETOOLONG));
        assert!(check_name(c"..").is_ok());
        assert_eq!(
            check_entry_name(c"..", libc::EEXIST)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EEXIST)
        );
    }
}
