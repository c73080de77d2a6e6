//! The command line's tests: flags, their errors, virtiofsd's spellings.
use super::*;
use crate::state::OnError;

fn parse(args: &[&str]) -> Result<Config, ParseError> {
    let mut full = vec!["volfsd".to_string()];
    full.extend(args.iter().map(|s| s.to_string()));
    super::parse(&full)
}

#[test]
fn allowed_dir_rate_limits_follow_the_access_and_a_comma_in_a_path_stays() {
    let (path, l) =
        split_rate_limit("data:ro,ops_size=1000,bw_size=4096,bw_refill_time_ms=10").unwrap();
    assert_eq!(path, "data:ro");
    let l = l.unwrap();
    assert_eq!(l.ops.unwrap().size, 1000);
    assert_eq!(l.ops.unwrap().refill_time_ms, qos::DEFAULT_REFILL_TIME_MS);
    assert_eq!(l.bandwidth.unwrap().refill_time_ms, 10);
    assert_eq!(split_rate_limit("a,b:rw").unwrap(), ("a,b:rw", None));
    assert_eq!(split_rate_limit("a,b").unwrap(), ("a,b", None));
    let e = split_rate_limit("data,ops_size=0").unwrap_err().to_string();
    assert!(e.contains("size must be above 0"), "{e}");
    let e = split_rate_limit("data,ops_refill_time_ms=100")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ops: size"), "{e}");
    let e = split_rate_limit("data,ops_size=ten")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ops_size"), "{e}");

    let dir = std::env::temp_dir().join(format!("volfsd-cfg-qos-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let d = dir.to_str().unwrap();
    let c = parse(&[
        "--socket-path",
        "/a",
        "--shared-dir",
        d,
        "--allowed-dir",
        "a:ro,ops_size=5",
    ])
    .unwrap();
    let spec = &c.allowed_dirs.unwrap()[0];
    assert!(spec.read_only);
    assert_eq!(spec.guest, ["a"]);
    assert_eq!(spec.rate_limit.unwrap().ops.unwrap().size, 5);
    let e = parse(&[
        "--socket-path",
        "/a",
        "--shared-dir",
        d,
        "--allowed-dir",
        "a,ops_size=x",
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("--allowed-dir a,ops_size=x"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn minimal_socket_path() {
    let c = parse(&["--socket-path", "/tmp/x.sock", "--shared-dir", "/tmp"]).unwrap();
    assert_eq!(c.socket, SocketSource::Path("/tmp/x.sock".into()));
    assert_eq!(c.cache, CacheMode::None);
    assert!(!c.readonly);
}

#[test]
fn never_is_none() {
    let c = parse(&["--fd", "3", "--shared-dir", "/tmp", "--cache", "never"]).unwrap();
    assert_eq!(c.cache, CacheMode::None);
    assert_eq!(c.socket, SocketSource::Fd(3));
    let c = parse(&["--fd", "3", "--shared-dir", "/tmp", "--cache=always"]).unwrap();
    assert_eq!(c.cache, CacheMode::Always);
}

#[test]
fn socket_required_exactly_once() {
    let e = parse(&["--shared-dir", "/tmp"]).unwrap_err().to_string();
    assert!(e.contains("--socket-path"), "{e}");
    let e = parse(&["--socket-path", "/a", "--fd", "3", "--shared-dir", "/tmp"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--fd") || e.contains("cannot be used"), "{e}");
}

#[test]
fn shared_dir_must_be_a_directory() {
    let e = parse(&["--socket-path", "/a", "--shared-dir", "/nonexistent/x"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--shared-dir /nonexistent/x"), "{e}");
    let e = parse(&["--socket-path", "/a", "--shared-dir", "/etc/hostname"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn unsupported_virtiofsd_options_are_named() {
    let e = parse(&[
        "--socket-path",
        "/a",
        "--shared-dir",
        "/tmp",
        "--xattrmap=:map::user.virtiofs.:",
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("'--xattrmap'"), "{e}");
    let e = parse(&["--socket-path", "/a", "-o", "writeback"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("'-o writeback'"), "{e}");
}

#[test]
fn virtiofsd_compat_form_configures_the_same() {
    let c = parse(&["--fd=3", "-o", "source=/tmp,cache=metadata,xattr", "-f"]).unwrap();
    assert_eq!(c.shared_dir, Path::new("/tmp").canonicalize().unwrap());
    assert_eq!((c.cache, c.xattr), (CacheMode::Metadata, true));
    let c = parse(&["--fd=3", "--shared-dir=/tmp", "-o", "xattr,no_xattr"]).unwrap();
    assert!(!c.xattr);
}

#[test]
fn posix_acl_modes_as_virtiofsd_spells_them() {
    let base = ["--fd=3", "--shared-dir=/tmp"];
    let with = |extra: &[&str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        parse(&v)
    };
    assert_eq!(with(&[]).unwrap().posix_acl, PosixAclArg::Never);
    let c = with(&["--posix-acl"]).unwrap();
    assert_eq!((c.posix_acl, c.xattr), (PosixAclArg::Always, true));
    assert_eq!(
        with(&["--posix-acl=auto"]).unwrap().posix_acl,
        PosixAclArg::Auto
    );
    assert_eq!(
        with(&["-o", "posix_acl"]).unwrap().posix_acl,
        PosixAclArg::Always
    );
    assert!(with(&["--posix-acl=sometimes"]).is_err());
}

#[test]
fn direct_io_and_readdirplus_switches() {
    let c = parse(&["--fd=3", "--shared-dir=/tmp"]).unwrap();
    assert!(!c.allow_direct_io && c.readdirplus);
    let c = parse(&[
        "--fd=3",
        "--shared-dir=/tmp",
        "--allow-direct-io",
        "--no-readdirplus",
    ])
    .unwrap();
    assert!(c.allow_direct_io && !c.readdirplus);
    let c = parse(&[
        "--fd=3",
        "--shared-dir=/tmp",
        "-o",
        "allow_direct_io,no_allow_direct_io",
    ])
    .unwrap();
    assert!(!c.allow_direct_io);
}

#[test]
fn a_repeated_flag_takes_its_last_value_and_lists_keep_every_value() {
    let c = parse(&[
        "--fd=3",
        "--shared-dir=/tmp",
        "--cache=never",
        "--cache=metadata",
        "--translate-uid=map:0:1000:1",
        "--translate-uid=forbid-guest:1:10",
    ])
    .unwrap();
    assert_eq!(c.cache, CacheMode::Metadata);
    assert_eq!(c.uids.to_host(0).unwrap(), 1000);
    assert!(c.uids.to_host(5).is_err());
}

#[test]
fn submounts_are_announced_unless_the_last_word_says_otherwise() {
    let base = ["--fd=3", "--shared-dir=/tmp"];
    let with = |extra: &[&str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        parse(&v).unwrap().announce_submounts
    };
    assert!(with(&[]));
    assert!(with(&["-o", "announce_submounts"]));
    assert!(!with(&["--no-announce-submounts"]));
    assert!(with(&["--no-announce-submounts", "--announce-submounts"]));
    assert!(!with(&["--announce-submounts", "--no-announce-submounts"]));
}

#[test]
fn migration_flags_have_virtiofsd_meaning() {
    let c = parse(&["--socket-path=/tmp/s", "--shared-dir=/tmp"]).unwrap();
    assert_eq!(c.migration, MigrationOptions::default());
    assert!(!c.keep_serving);
    let c = parse(&[
        "--socket-path=/tmp/s",
        "--shared-dir=/tmp",
        "--migration-mode=file-handles",
        "--migration-on-error=guest-error",
        "--keep-serving",
    ])
    .unwrap();
    assert!(c.warnings.is_empty(), "no longer ignored: {:?}", c.warnings);
    assert_eq!(c.migration.save.mode, MigrationMode::FileHandles);
    assert_eq!(c.migration.load.on_error, OnError::GuestError);
    assert!(c.keep_serving);
    // KubeVirt's spelling, values apart.
    let c = parse(&[
        "--socket-path=/tmp/s",
        "--shared-dir=/tmp",
        "--migration-mode",
        "find-paths",
        "--migration-verify-handles",
        "--migration-confirm-paths",
    ])
    .unwrap();
    assert!(c.migration.save.verify_handles && c.migration.save.confirm_paths);
    let err = |v: &[&str]| match parse(v) {
        Ok(_) => panic!("accepted: {v:?}"),
        Err(e) => e.to_string(),
    };
    let e = err(&[
        "--socket-path=/tmp/s",
        "--shared-dir=/tmp",
        "--migration-mode=file-handles",
        "--migration-verify-handles",
    ]);
    assert!(e.contains("--migration-verify-handles"), "{e}");
    let e = err(&[
        "--socket-path=/tmp/s",
        "--shared-dir=/tmp",
        "--migration-mode=teleport",
    ]);
    assert!(e.contains("teleport") && e.contains("find-paths"), "{e}");
}

#[test]
fn sandbox_and_seccomp_default_to_the_strictest() {
    let c = parse(&["--socket-path", "/a", "--shared-dir", "/tmp"]).unwrap();
    assert_eq!(c.sandbox, SandboxMode::Namespace);
    assert_eq!(c.seccomp, SeccompMode::Kill);
    // virtiofsd's spellings, with '=' and without.
    let c = parse(&[
        "--socket-path",
        "/a",
        "--shared-dir",
        "/tmp",
        "--sandbox=chroot",
        "--seccomp",
        "log",
    ])
    .unwrap();
    assert_eq!(
        (c.sandbox, c.seccomp),
        (SandboxMode::Chroot, SeccompMode::Log)
    );
    let e = parse(&[
        "--socket-path",
        "/a",
        "--shared-dir",
        "/tmp",
        "--sandbox",
        "jail",
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("--sandbox") && e.contains("namespace"), "{e}");
}

#[test]
fn unknown_options_are_named() {
    let e = parse(&["--socket-path", "/a", "--shared-dir", "/tmp", "--bogus"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--bogus"), "{e}");
}

#[test]
fn socket_paths_are_checked() {
    let long = format!("/tmp/{}", "x".repeat(120));
    let e = parse(&["--socket-path", &long, "--shared-dir", "/tmp"])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--socket-path /tmp/xxx") && e.contains("107"),
        "{e}"
    );
    let e = parse(&["--socket-path", "/nonexistent/s", "--shared-dir", "/tmp"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--socket-path /nonexistent/s: directory /nonexistent"),
        "{e}"
    );
    let e = parse(&[
        "--socket-path",
        "/tmp/s",
        "--shared-dir",
        "/tmp",
        "--control-socket",
        "/etc/hostname/c",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--control-socket /etc/hostname/c: /etc/hostname is not a directory"),
        "{e}"
    );
    assert!(parse(&["--socket-path", "rel.sock", "--shared-dir", "/tmp"]).is_ok());
}

#[test]
fn socket_group_by_name_or_gid() {
    let c = parse(&[
        "--socket-path",
        "/tmp/s",
        "--shared-dir",
        "/tmp",
        "--socket-group",
        "root",
    ])
    .unwrap();
    assert_eq!(c.socket_group, Some(0));
    let c = parse(&[
        "--socket-path=/tmp/s",
        "--shared-dir=/tmp",
        "--socket-group=4321",
    ])
    .unwrap();
    assert_eq!(c.socket_group, Some(4321));
    let e = parse(&[
        "--socket-path=/tmp/s",
        "--shared-dir=/tmp",
        "--socket-group=no-such-grp",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--socket-group no-such-grp: no such group"),
        "{e}"
    );
    let e = parse(&["--fd=3", "--shared-dir=/tmp", "--socket-group=root"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--socket-group"), "{e}");
}

#[test]
fn capabilities_are_fs_with_the_features_volfsd_has() {
    let doc: serde_json::Value = serde_json::from_str(capabilities_json()).unwrap();
    assert_eq!(doc["type"], "fs");
    assert_eq!(
        doc["features"],
        serde_json::json!([
            "migrate-precopy",
            "posix-acl-negotiation-mode",
            "separate-options"
        ])
    );
}
