//! Allowed dirs as configured: a bad one is refused naming its path and why, and the
//! daemon exits 1.

use std::fs;

use volfsd_harness::fixtures;

use crate::platform_layout;

#[test]
fn allowed_dir_validation_names_path_and_reason() {
    let sd = platform_layout();
    let root = sd.path().canonicalize().unwrap();
    fs::create_dir(root.join("a/nested")).unwrap();
    std::os::unix::fs::symlink("hidden", root.join("link")).unwrap();
    let err = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        volfsd::exports::config::parse_allowed_dirs(&root, &args)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&["missing"]).contains("--allowed-dir missing: does not exist"));
    assert!(err(&["top-level-file"]).contains("not a directory"));
    assert!(err(&["link"]).contains("symlink"));
    assert!(err(&["a/../hidden"]).contains(".."));
    assert!(err(&["/etc"]).contains("not inside SharedDir"));
    assert!(err(&["a", "a:ro"]).contains("given twice"));
    assert!(err(&["a", "a/nested"]).contains("overlaps"));
    assert!(err(&["a/nested", "a"]).contains("overlaps"));
}

#[test]
fn daemon_exits_1_on_a_bad_allowed_dir() {
    let sd = platform_layout();
    let out = std::process::Command::new(fixtures::volfsd_binary())
        .args(["--socket-path", "/tmp/volfsd-never.sock", "--shared-dir"])
        .arg(sd.path())
        .args(["--allowed-dir", "nope:ro"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--allowed-dir nope:ro: does not exist"),
        "{stderr}"
    );
}
