//! An upgrade's pre-copy on one host (docs/UPGRADE.md): the old process's preview of
//! the nodes, taken while it serves, preloaded by the new one; the state after it
//! names the nodes of the preview that still live only by id. What changed between
//! the two (renames, forgets, lookups, new nodes) arrives; a state naming as
//! previewed a node that was not preloaded is refused whole.

use std::os::unix::fs::MetadataExt;

use volfsd::exports::state::format::{self, Kind, Previewed};
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps};

use crate::destination;

/// What volfsd's keeper writes into the socket it saves on (src/device/state_transfer.rs).
const PREVIEW: &[u8] = b"volfsd-preview\n";
const AFTER_PREVIEW: &[u8] = b"volfsd-after-preview\n";

#[test]
fn what_changed_between_the_preview_and_the_pause_arrives() {
    if is_virtiofsd() {
        return;
    }
    let src = Daemon::start("state-preview", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    std::fs::create_dir_all(host.join("d")).unwrap();
    for f in ["a", "b", "gone", "kept"] {
        std::fs::write(host.join("d").join(f), f).unwrap();
    }
    let d = c.lookup(ROOT, "d").unwrap().nodeid;
    let id = |c: &mut FuseClient, name: &str| c.lookup(d, name).unwrap().nodeid;
    let (a, b, gone, kept) = (
        id(&mut c, "a"),
        id(&mut c, "b"),
        id(&mut c, "gone"),
        id(&mut c, "kept"),
    );

    let preview = c.device().save_state_requesting(PREVIEW).unwrap();
    assert_eq!(format::kind(&preview), Kind::Preview);
    let p = format::decode_preview(&preview).unwrap();
    assert_eq!(p.keys.len(), p.state.nodes.len());
    assert!(p.state.handles.is_empty() && p.state.fuse.is_none());

    // Between the preview and the pause: renamed, forgotten, looked up again, new.
    c.rename(d, "a", d, "a2").unwrap();
    c.forget(gone, 1).unwrap();
    assert_eq!(id(&mut c, "b"), b);
    std::fs::write(host.join("d/new"), b"new").unwrap();
    let new = id(&mut c, "new");
    let inode = |c: &mut FuseClient, n: u64| c.getattr(n).unwrap().attr.ino;
    let inodes: Vec<(u64, u64)> = [d, a, b, kept, new]
        .into_iter()
        .map(|n| (n, inode(&mut c, n)))
        .collect();
    assert_eq!(
        inode(&mut c, a),
        std::fs::metadata(host.join("d/a2")).unwrap().ino()
    );

    let after = c.device().save_state_requesting(AFTER_PREVIEW).unwrap();
    assert_eq!(format::kind(&after), Kind::Upgrade);
    let up = format::decode_upgrade(&after).unwrap();
    assert_eq!(up.preview, p.id);
    let previewed: Vec<u64> = up.previewed.iter().map(|p| p.id).collect();
    for n in [d, a, b, kept] {
        assert!(
            previewed.contains(&n),
            "node {n} not as previewed: {previewed:?}"
        );
    }
    assert!(!previewed.contains(&gone) && !previewed.contains(&new));
    assert!(!up.state.nodes.iter().any(|n| n.id == gone));
    assert!(
        up.state.nodes.iter().any(|n| n.id == new),
        "the new node in full"
    );
    assert_eq!(
        up.previewed.iter().find(|p| p.id == b).unwrap().lookups,
        2,
        "b's lookups as they are at the pause"
    );

    let dst = destination(&src, "state-preview-dst", &[]);
    let mut cfg = dst.config();
    cfg.preload_state = Some(preview);
    cfg.load_state = Some(after);
    let mut g = FuseClient::connect(&cfg)
        .unwrap_or_else(|e| panic!("the state after the preview loads: {e}\n{}", dst.log()));
    for (n, ino) in inodes {
        assert_eq!(inode(&mut g, n), ino, "node {n} is the inode it was");
    }
    assert!(
        g.getattr(gone).is_err(),
        "a node forgotten since the preview is gone"
    );
    assert_eq!(g.lookup(d, "a2").unwrap().nodeid, a);
    assert_eq!(g.lookup(d, "new").unwrap().nodeid, new);
}

#[test]
fn a_node_named_as_previewed_that_was_not_preloaded_fails_the_whole_load() {
    if is_virtiofsd() {
        return;
    }
    let src = Daemon::start("state-preview-forged", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    std::fs::write(host.join("x"), b"x").unwrap();
    let x = c.lookup(ROOT, "x").unwrap().nodeid;
    let preview = c.device().save_state_requesting(PREVIEW).unwrap();
    std::fs::write(host.join("later"), b"later").unwrap();
    let later = c.lookup(ROOT, "later").unwrap().nodeid;
    let after = c.device().save_state_requesting(AFTER_PREVIEW).unwrap();
    let up = format::decode_upgrade(&after).unwrap();
    assert!(up.previewed.iter().any(|p| p.id == x));

    // The node new since the preview, named as previewed instead of in full.
    let mut forged = up.clone();
    forged.state.nodes.retain(|n| n.id != later);
    forged.previewed.push(Previewed {
        id: later,
        lookups: 1,
    });
    // Another preview's state; the same node named twice; a node id out of range.
    let mut other = up.clone();
    other.preview ^= 1;
    let mut twice = up.clone();
    twice.previewed.push(twice.previewed[0]);
    let mut beyond = up.clone();
    beyond.previewed.push(Previewed {
        id: up.state.next_node_id,
        lookups: 1,
    });
    for (what, state, preload) in [
        ("a node not preloaded", &forged, true),
        ("another preview", &other, true),
        ("a node named twice", &twice, true),
        ("an id past the counter", &beyond, true),
        ("no preview preloaded", &up, false),
    ] {
        // A daemon serves one frontend: one each.
        let dst = destination(&src, "state-preview-forged-dst", &[]);
        let mut cfg = dst.config();
        cfg.preload_state = preload.then(|| preview.clone());
        cfg.load_state = Some(format::encode_upgrade(state));
        assert!(FuseClient::connect(&cfg).is_err(), "{what}: loaded");
        assert!(
            dst.log().contains("device state: "),
            "{what}: {}",
            dst.log()
        );
    }
    // The real one loads, and the source serves on throughout.
    let dst = destination(&src, "state-preview-forged-dst", &[]);
    let mut cfg = dst.config();
    cfg.preload_state = Some(preview);
    cfg.load_state = Some(after);
    let mut g = FuseClient::connect(&cfg).expect("the state after the preview loads");
    assert_eq!(
        g.getattr(later).unwrap().attr.ino,
        c.getattr(later).unwrap().attr.ino
    );
    assert_eq!(
        g.getattr(x).unwrap().attr.ino,
        c.getattr(x).unwrap().attr.ino
    );
}
