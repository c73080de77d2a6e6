//! The loader's checks of hostile names and paths.
use super::*;

#[test]
fn names_and_paths_from_a_state_are_single_components_and_relative() {
    assert!(check_component(b"a").is_ok());
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", &[b'x'; 256]] {
        assert!(check_component(bad).is_err(), "{bad:?}");
    }
    assert_eq!(check_path(b"a/b/c").unwrap().len(), 3);
    for bad in [
        &b""[..],
        b"/etc",
        b"a/../b",
        b"a//b",
        b"a/.",
        b"../x",
        b"a/",
    ] {
        assert!(check_path(bad).is_err(), "{:?}", display(bad));
    }
    assert!(check_path(&vec![b'a'; MAX_PATH + 1]).is_err());
}
