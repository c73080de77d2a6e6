//! Target `paths`: `resolve_share_path`, `valid_volume_name`, `split_access` and
//! `parse_allowed_dirs` on a SharedDir with directories, a file, symlinks (one
//! pointing out of it) and names with colons.
//!
//! Input: the whole input is one name and one path; split at b'\n', its lines are
//! `--allowed-dir` arguments.
//!
//! Oracle: no panic; `valid_volume_name` agrees with `^[a-zA-Z0-9_-]{1,128}$`; every
//! path accepted lies strictly inside SharedDir, names no `..`, is a directory and
//! no symlink on the way, and equals SharedDir joined with its components; accepted
//! allowed dirs do not overlap and their components pass the name rule.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::OnceLock;

use volfsd::exports::config::{parse_allowed_dirs, split_access};
use volfsd::exports::fs::names::valid_volume_name;
use volfsd::exports::fs::resolve_share_path;
use volfsd::exports::fs::SharePath;

use crate::common::Scratch;

struct State {
    scratch: Scratch,
}

fn state() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
    S.get_or_init(|| {
        let scratch = Scratch::new("paths", None);
        let p = scratch.path();
        for d in [
            "a", "b", "a/nested", "rw/vol-a", "x:ro", "models", "sp ace", "ü",
        ] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        std::fs::write(p.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("a", p.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", p.join("out")).unwrap();
        std::os::unix::fs::symlink("../..", p.join("a/up")).unwrap();
        State { scratch }
    })
}

fn name_rule(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn check_accepted(shared: &Path, input: &Path, sp: &SharePath) {
    assert!(
        !input.components().any(|c| c == Component::ParentDir),
        "accepted a path with '..': {input:?}"
    );
    assert!(!sp.rel.is_empty(), "accepted SharedDir itself: {input:?}");
    assert!(
        sp.host.starts_with(shared) && sp.host != shared,
        "accepted {input:?} -> {:?} outside {shared:?}",
        sp.host
    );
    let joined = sp.rel.iter().fold(shared.to_path_buf(), |p, c| p.join(c));
    assert_eq!(
        joined, sp.host,
        "host path is not SharedDir + rel for {input:?}"
    );
    for c in &sp.rel {
        assert!(!c.is_empty() && c != "." && c != ".." && !c.contains('/'));
    }
    // No symlink anywhere between SharedDir and the end, and a directory at the end.
    let mut p = shared.to_path_buf();
    for c in &sp.rel {
        p.push(c);
        let m = std::fs::symlink_metadata(&p).expect("accepted path exists");
        assert!(
            !m.file_type().is_symlink(),
            "accepted {input:?} through symlink {p:?}"
        );
    }
    assert!(std::fs::symlink_metadata(&sp.host).unwrap().is_dir());
    assert_eq!(sp.host.canonicalize().unwrap(), sp.host);
}

pub fn run_paths(data: &[u8]) {
    let st = state();
    let shared = st.scratch.path();

    if let Ok(s) = std::str::from_utf8(data) {
        assert_eq!(
            valid_volume_name(s),
            name_rule(s),
            "name rule differs for {s:?}"
        );
        let (p, ro) = split_access(s);
        assert!(s.starts_with(p));
        if ro {
            assert!(s.ends_with(":ro"));
        }
    }

    // The whole input as one path, relative and made absolute under SharedDir.
    let input = Path::new(OsStr::from_bytes(data));
    if let Ok(sp) = resolve_share_path(shared, input) {
        check_accepted(shared, input, &sp);
    }
    if !data.contains(&0) {
        let abs = shared.join(input);
        if let Ok(sp) = resolve_share_path(shared, &abs) {
            check_accepted(shared, &abs, &sp);
        }
    }

    // Lines as --allowed-dir arguments.
    let text = String::from_utf8_lossy(data);
    let args: Vec<String> = text.split('\n').take(16).map(str::to_string).collect();
    if let Ok(specs) = parse_allowed_dirs(shared, &args) {
        assert_eq!(specs.len(), args.len());
        for (spec, arg) in specs.iter().zip(&args) {
            let (p, ro) = split_access(arg);
            assert_eq!(spec.read_only, ro);
            check_accepted(shared, Path::new(p), &spec.path);
            assert!(spec.guest.iter().all(|c| valid_volume_name(c)));
            assert_eq!(spec.guest, spec.path.rel);
        }
        for (i, a) in specs.iter().enumerate() {
            for b in &specs[i + 1..] {
                assert!(
                    !a.path.overlaps(&b.path),
                    "overlapping allowed dirs accepted: {:?} {:?}",
                    a.path.rel,
                    b.path.rel
                );
            }
        }
    }
}
