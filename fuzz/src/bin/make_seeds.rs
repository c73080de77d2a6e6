//! Writes the seed corpora under `fuzz/corpus/<target>/` (committed; re-run after a
//! change of an input format): `cargo run --manifest-path fuzz/Cargo.toml --bin make_seeds`.

use std::path::Path;

use volfsd_fuzz::fuse::{init_body, op, record};
use volfsd_fuzz::virtqueue::build_input;

fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}
fn le64(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}
fn name(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

const NO_FH: u8 = 0xff;
const O_RDWR: u32 = libc::O_RDWR as u32;

fn open_in(flags: u32) -> Vec<u8> {
    cat(&[&le32(flags), &le32(0)])
}
fn read_in(offset: u64, size: u32) -> Vec<u8> {
    cat(&[
        &le64(0),
        &le64(offset),
        &le32(size),
        &le32(0),
        &le64(0),
        &le32(0),
        &le32(0),
    ])
}
fn write_in(offset: u64, data: &[u8]) -> Vec<u8> {
    cat(&[
        &le64(0),
        &le64(offset),
        &le32(data.len() as u32),
        &le32(0),
        &le64(0),
        &le32(0),
        &le32(0),
        data,
    ])
}
fn release_in() -> Vec<u8> {
    cat(&[&le64(0), &le32(0), &le32(0), &le64(0)])
}
fn create_in(flags: u32, mode: u32, n: &str) -> Vec<u8> {
    cat(&[&le32(flags), &le32(mode), &le32(0o022), &le32(0), &name(n)])
}
fn setattr_in(valid: u32, size: u64, mode: u32) -> Vec<u8> {
    let mut b = cat(&[&le32(valid), &le32(0), &le64(0), &le64(size)]);
    b.extend_from_slice(&[0u8; 8 * 4 + 4 * 3]); // lock_owner, atime, mtime, ctime, *nsec
    b.extend_from_slice(&cat(&[&le32(mode), &le32(0), &le32(0), &le32(0), &le32(0)]));
    b
}

/// The `fuse` target's seeds: (file name, records). The node indexes in the comments
/// are positions in the harvested node list (node selector = index + 1).
fn fuse_seeds() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let lookup = |node: u8, n: &str| record(op::LOOKUP, node, NO_FH, 0, &name(n));
    vec![
        (
            "read-write-file",
            vec![
                lookup(0, "rw"),                                 // node 0: rw
                lookup(1, "f"),                                  // node 1: rw/f
                record(op::OPEN, 2, NO_FH, 0, &open_in(O_RDWR)), // fh 0
                record(op::READ, 2, 0, 0, &read_in(0, 4096)),
                record(op::WRITE, 2, 0, 0, &write_in(3, b"WRITTEN")),
                record(
                    op::FLUSH,
                    2,
                    0,
                    0,
                    &cat(&[&le64(0), &le32(0), &le32(0), &le64(0)]),
                ),
                record(op::FSYNC, 2, 0, 0, &cat(&[&le64(0), &le32(0), &le32(0)])),
                record(op::RELEASE, 2, 0, 0, &release_in()),
            ],
        ),
        (
            "create-setattr",
            vec![
                lookup(0, "rw"),
                record(op::CREATE, 1, NO_FH, 0, &create_in(O_RDWR, 0o100644, "new")), // node 1, fh 0
                record(op::WRITE, 2, 0, 0, &write_in(0, &[b'z'; 100])),
                record(
                    op::SETATTR,
                    2,
                    0,
                    0,
                    &setattr_in(1 << 3 | 1 << 0, 10, 0o600),
                ), // SIZE|MODE
                record(op::GETATTR, 2, 0, 0, &cat(&[&le32(1), &le32(0), &le64(0)])),
                record(
                    op::FALLOCATE,
                    2,
                    0,
                    0,
                    &cat(&[&le64(0), &le64(0), &le64(8192), &le32(0), &le32(0)]),
                ),
                record(
                    op::LSEEK,
                    2,
                    0,
                    0,
                    &cat(&[&le64(0), &le64(0), &le32(3), &le32(0)]),
                ), // SEEK_DATA
                record(op::RELEASE, 2, 0, 0, &release_in()),
            ],
        ),
        (
            "mknod-mkdir-rename",
            vec![
                lookup(0, "rw"),
                record(
                    op::MKNOD,
                    1,
                    NO_FH,
                    0,
                    &cat(&[&le32(0o100644), &le32(0), &le32(0), &le32(0), &name("node")]),
                ), // node 1
                record(
                    op::MKNOD,
                    1,
                    NO_FH,
                    0,
                    &cat(&[&le32(0o010644), &le32(0), &le32(0), &le32(0), &name("fifo")]),
                ), // node 2
                record(
                    op::MKDIR,
                    1,
                    NO_FH,
                    0,
                    &cat(&[&le32(0o755), &le32(0o022), &name("sub")]),
                ), // node 3
                record(
                    op::RENAME,
                    1,
                    0,
                    0,
                    &cat(&[&le64(1), &name("node"), &name("moved")]),
                ), // newdir = node 0
                record(op::OPEN, 3, NO_FH, 0, &open_in(0)),
                record(op::UNLINK, 1, NO_FH, 0, &name("fifo")),
                record(
                    op::RENAME2,
                    1,
                    3,
                    0,
                    &cat(&[&le64(1), &le32(1), &le32(0), &name("f"), &name("moved")]),
                ), // NOREPLACE into sub
                record(op::RMDIR, 1, NO_FH, 0, &name("sub")),
            ],
        ),
        (
            "read-only-volume",
            vec![
                lookup(0, "ro"), // node 0
                lookup(1, "f"),  // node 1
                record(
                    op::GETXATTR,
                    2,
                    NO_FH,
                    0,
                    &cat(&[&le32(64), &le32(0), &name("user.tag")]),
                ),
                record(op::LISTXATTR, 2, NO_FH, 0, &cat(&[&le32(256), &le32(0)])),
                record(
                    op::SETXATTR,
                    2,
                    NO_FH,
                    0,
                    &cat(&[&le32(1), &le32(0), &name("user.new"), b"v"]),
                ),
                record(op::REMOVEXATTR, 2, NO_FH, 0, &name("user.tag")),
                record(op::OPEN, 2, NO_FH, 0, &open_in(O_RDWR)),
                record(op::SETATTR, 2, NO_FH, 0, &setattr_in(1 << 3, 0, 0)),
                record(op::CREATE, 1, NO_FH, 0, &create_in(O_RDWR, 0o100644, "x")),
                record(op::UNLINK, 1, NO_FH, 0, &name("f")),
            ],
        ),
        (
            "readdirplus",
            vec![
                lookup(0, "rw"),
                record(op::OPENDIR, 1, NO_FH, 0, &open_in(0)), // fh 0
                record(op::READDIRPLUS, 1, 0, 0, &read_in(0, 4096)), // nodes 1..
                record(op::READDIR, 1, 0, 0, &read_in(0, 4096)),
                record(op::RELEASEDIR, 1, 0, 0, &release_in()),
                record(op::OPENDIR, 0, NO_FH, 0, &open_in(0)),
                record(op::READDIRPLUS, 0, 1, 0, &read_in(0, 4096)),
                record(
                    op::GETATTR,
                    3,
                    NO_FH,
                    0,
                    &cat(&[&le32(0), &le32(0), &le64(0)]),
                ),
            ],
        ),
        (
            "symlink-link-statfs",
            vec![
                lookup(0, "rw"),
                record(op::SYMLINK, 1, NO_FH, 0, &cat(&[&name("sl"), &name("f")])), // node 1
                record(op::READLINK, 2, NO_FH, 0, &[]),
                lookup(1, "f"),                                              // node 2
                record(op::LINK, 1, 2, 0, &cat(&[&le64(0), &name("hard")])), // oldnodeid = node 2
                record(op::STATFS, 1, NO_FH, 0, &[]),
                record(op::ACCESS, 3, NO_FH, 1, &cat(&[&le32(2), &le32(0)])),
                record(op::FORGET, 3, NO_FH, 0, &le64(1)),
                record(
                    op::BATCH_FORGET,
                    0,
                    NO_FH,
                    0,
                    &cat(&[&le32(1), &le32(0), &le64(2), &le64(1)]),
                ),
            ],
        ),
        (
            "tmpfile-copy-locks",
            vec![
                lookup(0, "rw"),
                lookup(1, "f"), // node 1
                record(op::TMPFILE, 1, NO_FH, 0, &create_in(O_RDWR, 0o100600, "")), // node 2, fh 0
                record(op::OPEN, 2, NO_FH, 0, &open_in(O_RDWR)), // fh 1
                record(
                    op::COPY_FILE_RANGE,
                    2,
                    1,
                    0,
                    &cat(&[
                        &le64(0),
                        &le64(0),
                        &le64(0),
                        &le64(0),
                        &le64(100),
                        &le64(5),
                        &le64(0),
                    ]),
                ),
                record(
                    op::SETLK,
                    2,
                    1,
                    0,
                    &cat(&[
                        &le64(0),
                        &le64(7),
                        &le64(0),
                        &le64(100),
                        &le32(1),
                        &le32(0),
                        &le32(0),
                        &le32(0),
                    ]),
                ),
                record(
                    op::GETLK,
                    2,
                    1,
                    0,
                    &cat(&[
                        &le64(0),
                        &le64(8),
                        &le64(0),
                        &le64(100),
                        &le32(1),
                        &le32(0),
                        &le32(0),
                        &le32(0),
                    ]),
                ),
                record(op::SYNCFS, 2, NO_FH, 0, &le64(0)),
                record(
                    op::STATX,
                    2,
                    NO_FH,
                    0,
                    &cat(&[&le32(0), &le32(0), &le64(0), &le32(0), &le32(0x7ff)]),
                ),
            ],
        ),
        (
            "escape-attempts",
            vec![
                lookup(0, ".."),
                lookup(0, "hidden"),
                lookup(0, "rw"),
                lookup(1, ".."),
                lookup(1, "l"),
                record(
                    op::SYMLINK,
                    1,
                    NO_FH,
                    0,
                    &cat(&[&name("up"), &name("../../..")]),
                ),
                lookup(1, "up"),
                record(op::OPEN, 3, NO_FH, 0, &open_in(0)),
                record(
                    op::RENAME,
                    1,
                    NO_FH,
                    0,
                    &cat(&[&le64(1), &name("f"), &name("ro")]),
                ),
            ],
        ),
        (
            "init-destroy",
            vec![
                record(op::INIT, 0, NO_FH, 0, &init_body()),
                lookup(0, "ro"),
                record(38, 0, NO_FH, 0, &[]), // DESTROY
                lookup(0, "rw"),
            ],
        ),
    ]
}

fn http(method: &str, path: &str, body: &str, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn control_seeds() -> Vec<(&'static str, String)> {
    let attach = http(
        "PUT",
        "/volumes/a",
        r#"{"path":"vols/a"}"#,
        "Content-Type: application/json\r\n",
    );
    let list = http("GET", "/volumes", "", "");
    let detach = http("DELETE", "/volumes/a", "", "");
    vec![
        ("health", http("GET", "/health", "", "")),
        ("list", list.clone()),
        ("get", http("GET", "/volumes/data", "", "")),
        (
            "attach-list-detach",
            format!("{attach}{list}{detach}{list}"),
        ),
        (
            "attach-ro-volume-id",
            http(
                "PUT",
                "/volumes/b",
                r#"{"path":"vols/b","read_only":true,"volume_id":"vol-123"}"#,
                "",
            ),
        ),
        ("attach-abs-retry", {
            let b = r#"{"path":"/tmp/../etc"}"#;
            format!(
                "{}{}",
                http("PUT", "/volumes/x", b, ""),
                http("PUT", "/volumes/a?x=1", r#"{"path":"vols/a"}"#, "")
            )
        }),
        (
            "attach-bad",
            format!(
                "{}{}{}",
                http("PUT", "/volumes/bad%20name", r#"{"path":"vols/a"}"#, ""),
                http("PUT", "/volumes/c", r#"{"path":"link","extra":1}"#, ""),
                http("PUT", "/volumes/data", r#"{"path":"ro"}"#, "")
            ),
        ),
        ("method-not-allowed", http("POST", "/volumes", "{}", "")),
        ("http10-close", "GET /volumes HTTP/1.0\r\n\r\n".to_string()),
        (
            "conn-close",
            http("GET", "/health", "", "Connection: close\r\n"),
        ),
        (
            "chunked",
            "PUT /volumes/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_string(),
        ),
        (
            "short-body",
            "PUT /volumes/a HTTP/1.1\r\nContent-Length: 50\r\n\r\n{}".to_string(),
        ),
    ]
}

fn paths_seeds() -> Vec<(&'static str, &'static str)> {
    vec![
        ("volume", "a"),
        ("nested", "rw/vol-a"),
        ("ro", "models:ro"),
        ("colon", "x:ro:rw"),
        ("two", "a\nb:ro"),
        ("overlap", "a\na/nested"),
        ("dotdot", "a/../b"),
        ("absolute", "/etc"),
        ("symlink", "link"),
        ("symlink-out", "out/passwd"),
        ("file", "file"),
        ("dot", "./a/."),
        ("name", "vol_1-A"),
        ("space", "sp ace\nü"),
    ]
}

fn virtqueue_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let req = |opcode: u32, unique: u64, nodeid: u64, body: &[u8]| {
        volfsd_fuzz::fuse::request(opcode, unique, nodeid, 0, body)
    };
    let init = req(26, 1, 0, &init_body());
    let lookup_rw = req(1, 2, 1, &name("rw"));
    let statfs = req(17, 3, 1, &[]);
    let getattr = req(3, 4, 1, &cat(&[&le32(0), &le32(0), &le64(0)]));
    let opendir = req(27, 5, 1, &open_in(0));
    let forget = req(2, 6, 2, &le64(1));
    vec![
        (
            "init-lookup",
            build_input(&[(init.clone(), 256), (lookup_rw.clone(), 256)], 16, 0),
        ),
        (
            "init-four",
            build_input(
                &[
                    (init.clone(), 256),
                    (lookup_rw, 256),
                    (statfs, 256),
                    (getattr, 256),
                ],
                16,
                1, // EVENT_IDX
            ),
        ),
        (
            "hiprio-forget",
            build_input(&[(init.clone(), 256), (forget, 0)], 8, 2 | 4),
        ),
        ("opendir-no-init", build_input(&[(opendir, 64)], 4, 0)),
        ("short-reply-buffer", build_input(&[(init, 8)], 2, 0)),
    ]
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = |target: &str, file: &str, data: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), data).unwrap();
    };
    for (n, records) in fuse_seeds() {
        write("fuse", n, &records.concat());
    }
    for (n, s) in control_seeds() {
        write("control", n, s.as_bytes());
    }
    for (n, s) in paths_seeds() {
        write("paths", n, s.as_bytes());
    }
    for (n, d) in virtqueue_seeds() {
        write("virtqueue", n, &d);
    }
    // States saved by a real stack on the target's scratch tree, loaded with the
    // default options (leading byte 0) and with guest-error (1); plus a forged one.
    for (i, state) in volfsd_fuzz::state::seed_states().iter().enumerate() {
        for opts in [0u8, 1] {
            let mut d = vec![opts];
            d.extend_from_slice(state);
            write("state", &format!("saved-{i}-opts-{opts}"), &d);
        }
    }
    write(
        "state",
        "not-a-state",
        b"\0VOLFSDST\x01\0\0\0\x05\0\0\0\0\0\0\0xxxxx",
    );
    // A saved state mutated where bytes rarely reach (options bit 2): the next node
    // id near the end of its range; two volumes on one root id; a volume renamed.
    let op = |kind: u8, index: u8, value: u64| cat(&[&[kind, index], &le64(value)]);
    for (name, ops) in [
        ("mutated-counter", op(0, 0, u64::MAX - 1)),
        ("mutated-root-ids", cat(&[&op(2, 1, 2), &op(2, 0, 2)])),
        ("mutated-volume-name", op(4, 0, 2)),
        ("mutated-read-only", op(3, 1, 0)),
    ] {
        write("state", name, &cat(&[&[4u8, 2], &ops]));
    }
    // Session regions a real stack recorded its session into, as the keeper's
    // serving process does; one of them also lists volumes it was never given.
    // Last: from here on this process records into the region.
    let (region, journal) = volfsd::exports::region::record_into(
        volfsd::exports::region::Region::create().unwrap(),
        volfsd::exports::region::Half::A,
    );
    region.header().set_in_session(true);
    region
        .set_volumes(r#"[{"name":"rw","volume":{"path":"rw","read_only":false}},{"name":"ro","volume":{"path":"ro","read_only":false}}]"#)
        .unwrap();
    let (recorded, foreign) = volfsd_fuzz::region::with_recorded_session(journal, || {
        let recorded = volfsd_fuzz::region::seed_writes(region);
        region
            .set_volumes(r#"[{"name":"hidden","volume":{"path":"hidden","read_only":false}}]"#)
            .unwrap();
        (recorded, volfsd_fuzz::region::seed_writes(region))
    });
    write("region", "recorded", &recorded);
    write("region", "recorded-foreign-volumes", &foreign);
    write("region", "empty", b"");
    println!("seeds written under {}", root.display());
}
