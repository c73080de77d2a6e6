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

#[test]
fn maps_keyed_by_loaded_ids_hash_with_a_key_of_their_own() {
    use std::hash::BuildHasher;
    // Ids a state names are chosen outside: each map's hash must be keyed (no
    // collisions a state's writer can aim at), so two maps place one id apart.
    let (a, b) = (IdMap::<()>::default(), IdSet::default());
    let id = 1u64 << 40;
    assert_ne!(a.hasher().hash_one(id), b.hasher().hash_one(id));
}
