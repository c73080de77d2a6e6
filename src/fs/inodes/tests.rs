//! The inode store's tests: lookups counted, forgets, limits, ids never reused.
use super::*;

fn store(max_nodes: usize) -> InodeStore {
    InodeStore::new(
        2,
        Arc::new(SessionEpoch::default()),
        Arc::new(FdBudget::new(1000)),
        max_nodes,
        None,
    )
}

fn key(ino: u64) -> InodeKey {
    InodeKey {
        dev: 1,
        ino,
        mnt_id: 1,
    }
}

fn root(store: &InodeStore) -> Arc<InodeData> {
    let s = Arc::new(Share::for_test("s", false));
    store
        .insert_fixed(1, File::open("/").unwrap(), key(1), libc::S_IFDIR, s)
        .unwrap()
}

fn child(store: &InodeStore, parent: &InodeData, ino: u64) -> io::Result<Arc<InodeData>> {
    store.insert_or_ref(
        InodeRef::Fd(File::open("/").unwrap()),
        key(ino),
        libc::S_IFDIR,
        parent,
        b"",
    )
}

#[test]
fn a_node_stays_small() {
    // 72 bytes + the Arc's two counts: a 96-byte malloc chunk per held inode.
    assert!(std::mem::size_of::<InodeData>() <= 72);
}

#[test]
fn same_key_same_nodeid_and_forget_releases() {
    let store = store(100);
    let r = root(&store);
    let a = child(&store, &r, 10).unwrap();
    let b = child(&store, &r, 10).unwrap();
    assert_eq!(a.nodeid, b.nodeid);
    store.forget(a.nodeid, 1);
    assert!(store.get(a.nodeid).is_ok());
    store.forget(a.nodeid, 1);
    assert!(store.get(a.nodeid).is_err());
    assert_eq!(store.count_share(&r.share), 1, "only the root is left");
}

#[test]
fn node_ids_are_never_reused() {
    let store = store(100);
    let r = root(&store);
    let first = child(&store, &r, 10).unwrap().nodeid;
    store.forget(first, 1);
    let again = child(&store, &r, 10).unwrap();
    assert_ne!(first, again.nodeid);
    assert!(store.get(first).is_err());
}

#[test]
fn fixed_nodes_survive_forget() {
    let store = store(100);
    root(&store);
    store.forget(1, u64::MAX / 2);
    assert!(store.get(1).is_ok());
}

#[test]
fn node_limit_gives_enfile_and_forget_makes_room() {
    let store = store(3); // the root and two more
    let r = root(&store);
    let a = child(&store, &r, 10).unwrap();
    child(&store, &r, 11).unwrap();
    let e = child(&store, &r, 12).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
    // An existing node needs no new fd: still served at the limit.
    assert!(child(&store, &r, 10).is_ok());
    store.forget(a.nodeid, 2);
    assert!(child(&store, &r, 12).is_ok());
}

#[test]
fn reset_drops_nodes_keeps_roots_and_refuses_old_parents() {
    let store = store(100);
    let r = root(&store);
    let a = child(&store, &r, 10).unwrap();
    assert_eq!(store.reset_session(), 1);
    assert!(store.get(a.nodeid).is_err(), "old node gone");
    let new_root = store.get(1).unwrap();
    assert!(new_root.epoch > r.epoch);
    // A request that began before the reset (holding the old root) cannot insert.
    let e = child(&store, &r, 11).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert!(child(&store, &new_root, 11).is_ok());
    assert_eq!(store.count_share(&r.share), 2);
}

#[test]
fn revoked_share_admits_nothing() {
    let store = store(100);
    let r = root(&store);
    r.share.revoke();
    assert_eq!(store.remove_share(&r.share), 1);
    assert!(child(&store, &r, 10).is_err());
    assert_eq!(store.count_share(&r.share), 0);
}
