//! Docs that cannot drift: every path into the daemon's source that README.md, a
//! document in docs/ or a comment in Cargo.toml names exists, docs/ARCHITECTURE.md's layout block names every module, and
//! the generated docs/BENCHMARKS.md shows every kept run.
//!
//! A `src/...` path counts as the daemon's when its first component is (or, as
//! `name.rs`, was) one of `src/`'s own entries: the documents also quote other
//! projects' `src/` trees (Kata's, libvirt's in docs/LAUNCHERS.md) and the
//! harness's own `src/` inside the layout block, which are not checked here.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness sits in the repository")
        .to_path_buf()
}

/// README.md, every document in docs/, and Cargo.toml (its comments say why each
/// dependency is there, and where it is used).
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![repo().join("README.md"), repo().join("Cargo.toml")];
    for entry in fs::read_dir(repo().join("docs")).expect("docs/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    docs.sort();
    docs
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// The `src/...` tokens of `text`: starting at a word boundary (not inside a longer
/// path such as `harness/src/...`), trailing dots and commas left off.
fn src_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("src/") {
        let start = i + at;
        i = start + 4;
        if start > 0 && is_path_char(bytes[start - 1] as char) {
            continue;
        }
        let end = text[start..]
            .find(|c: char| !is_path_char(c))
            .map_or(text.len(), |n| start + n);
        let token = text[start..end].trim_end_matches(['.', ',']);
        if token.contains("...") || token == "src/" {
            continue;
        }
        found.push(token.to_string());
    }
    found
}

/// Whether `path` is a path into the daemon's own source (see the module comment).
fn names_the_daemon(path: &str, own: &BTreeSet<String>) -> bool {
    let first = path["src/".len()..].split('/').next().unwrap_or("");
    let stem = first.strip_suffix(".rs").unwrap_or(first);
    own.contains(first) || own.contains(stem)
}

fn src_entries() -> BTreeSet<String> {
    fs::read_dir(repo().join("src"))
        .expect("src/")
        .map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map(str::to_string).unwrap_or(name)
        })
        .collect()
}

#[test]
fn every_source_path_the_docs_name_exists() {
    let own = src_entries();
    let mut missing = Vec::new();
    for doc in documents() {
        let text = fs::read_to_string(&doc).unwrap();
        for path in src_paths(&text) {
            if names_the_daemon(&path, &own) && !repo().join(&path).exists() {
                missing.push(format!(
                    "{}: {path}",
                    doc.strip_prefix(repo()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        missing.join("\n")
    );
}

/// docs/ARCHITECTURE.md's layout block: the fenced block that starts with
/// `Cargo.toml`.
fn layout_block() -> String {
    let page = fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap();
    let start = page
        .find("```\nCargo.toml")
        .expect("docs/ARCHITECTURE.md has a layout block starting with Cargo.toml");
    let rest = &page[start + 3..];
    rest[..rest.find("```").expect("the layout block ends")].to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `word` stands in `text` as a word of its own (a file named without
/// `.rs` in a list: "nodes, files, dirs").
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[test]
fn the_readme_layout_names_every_module() {
    let block = layout_block();
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    files.sort();
    let mut left_out = Vec::new();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let named = if name == "mod.rs" {
            // A directory module: its directory is named.
            let dir = file
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy();
            block.contains(&format!("{dir}/"))
        } else {
            block.contains(&name) || has_word(&block, name.trim_end_matches(".rs"))
        };
        if !named {
            left_out.push(file.strip_prefix(repo()).unwrap().display().to_string());
        }
    }
    assert!(
        left_out.is_empty(),
        "modules docs/ARCHITECTURE.md's layout block leaves out:\n{}",
        left_out.join("\n")
    );
}

#[test]
fn the_path_scanner_finds_what_it_must_and_skips_the_rest() {
    let text = "see `src/fs/passthrough.rs`, harness/src/frontend/ and src/daemon.rs.";
    assert_eq!(src_paths(text), ["src/fs/passthrough.rs", "src/daemon.rs"]);
    let own: BTreeSet<String> = ["fs", "daemon"].map(String::from).into();
    assert!(names_the_daemon("src/fs/passthrough.rs", &own));
    assert!(names_the_daemon("src/daemon.rs", &own));
    assert!(!names_the_daemon(
        "src/runtime/virtcontainers/qemu.go",
        &own
    ));
    assert!(has_word("nodes, files, dirs", "files"));
    assert!(!has_word("xattr_ops", "ops"));
}

/// docs/BENCHMARKS.md is generated from kept data (benches/report.py): a run named
/// in docs/bench-data/sections.txt that the page does not show, or an empty page
/// (a regeneration whose command failed once wrote one), is drift too.
#[test]
fn the_benchmarks_page_shows_every_kept_run() {
    let page = fs::read_to_string(repo().join("docs/BENCHMARKS.md")).expect("BENCHMARKS.md");
    assert!(
        page.starts_with("# Benchmarks"),
        "docs/BENCHMARKS.md is not the generated page (empty?): regenerate it with the \
         command at its end"
    );
    let sections = fs::read_to_string(repo().join("docs/bench-data/sections.txt")).unwrap();
    for line in sections.lines().filter(|l| l.starts_with("--")) {
        let dir = line.split_whitespace().nth(1).expect("--kind DIR");
        assert!(
            page.contains(dir),
            "docs/BENCHMARKS.md does not show {dir} (listed in sections.txt)"
        );
    }
}
