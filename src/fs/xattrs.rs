//! Which extended attributes the guest may touch (`--xattr`).
//!
//! The daemon runs as root, so a host `setxattr` would succeed in every namespace.
//! The guest may set `user.*` and POSIX ACLs (`system.posix_acl_access`,
//! `system.posix_acl_default`). `trusted.*` and `security.*` are privileged on the host
//! (overlayfs whiteouts, file capabilities, LSM labels): setting or removing them is
//! EPERM, and they are hidden from reads and listings, unless
//! `--allow-privileged-xattrs` is given. Other `system.*` names are EOPNOTSUPP.

use std::ffi::CStr;
use std::io;

use super::sys::errno;

/// Linux's XATTR_SIZE_MAX: no attribute value is larger.
pub const SIZE_MAX: usize = 65_536;
/// Linux's XATTR_LIST_MAX: no name list is larger.
pub const LIST_MAX: usize = 65_536;

const PRIVILEGED: [&[u8]; 2] = [b"trusted.", b"security."];
const ACLS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

fn is_privileged(name: &[u8]) -> bool {
    PRIVILEGED.iter().any(|p| name.starts_with(p))
}

/// Whether the guest may set or remove `name`.
pub fn check_write(name: &CStr, privileged_allowed: bool) -> io::Result<()> {
    let name = name.to_bytes();
    if name.starts_with(b"user.") || ACLS.contains(&name) {
        Ok(())
    } else if is_privileged(name) {
        if privileged_allowed {
            Ok(())
        } else {
            Err(errno(libc::EPERM))
        }
    } else {
        Err(errno(libc::EOPNOTSUPP))
    }
}

/// Whether `name` is kept from the guest's reads and listings.
pub fn is_hidden(name: &[u8], privileged_allowed: bool) -> bool {
    !privileged_allowed && is_privileged(name)
}

/// The buffer size for a GETXATTR of `size` from the guest.
pub fn clamp_size(size: u32) -> usize {
    (size as usize).min(SIZE_MAX)
}

/// The NUL-separated name list `list` without the hidden names.
pub fn visible_names(list: &[u8], privileged_allowed: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !is_hidden(name, privileged_allowed) {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        assert!(check_write(c"user.x", false).is_ok());
        assert!(check_write(c"system.posix_acl_access", false).is_ok());
        let e = |n: &CStr, p| check_write(n, p).unwrap_err().raw_os_error();
        assert_eq!(e(c"trusted.overlay.opaque", false), Some(libc::EPERM));
        assert_eq!(e(c"security.capability", false), Some(libc::EPERM));
        assert!(check_write(c"security.capability", true).is_ok());
        assert_eq!(e(c"system.nfs4_acl", true), Some(libc::EOPNOTSUPP));
        assert_eq!(e(c"bogus", false), Some(libc::EOPNOTSUPP));
    }

    #[test]
    fn listing_hides_privileged_names() {
        let list = b"user.a\0trusted.b\0security.selinux\0system.posix_acl_access\0";
        assert_eq!(
            visible_names(list, false),
            b"user.a\0system.posix_acl_access\0".to_vec()
        );
        assert_eq!(visible_names(list, true), list.to_vec());
        assert_eq!(clamp_size(u32::MAX), SIZE_MAX);
    }
}
