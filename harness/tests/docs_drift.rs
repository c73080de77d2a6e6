//! Docs that cannot drift:
//! - every path into the daemon's source, the harness or the VM tests that README.md,
//!   CONTRIBUTING.md, a document in docs/ or a comment in Cargo.toml names exists;
//! - docs/ARCHITECTURE.md's layout block names every module, each in its directory's lines;
//! - README.md links every document in docs/ and CONTRIBUTING.md exactly once (its
//!   Documentation list; elsewhere it names them without a link), and every
//!   `docs/...` path it or CONTRIBUTING.md names exists;
//! - every relative link in README.md, CONTRIBUTING.md and docs/ leads to a file
//!   that exists, and a link to a heading (`FILE.md#anchor`) to a heading of that
//!   file, as GitHub makes its anchors;
//! - the generated docs/BENCHMARKS.md shows every kept run.
//!
//! A `src/...` path counts as the daemon's when its first component is (or, as
//! `name.rs`, was) one of `src/`'s own entries: the documents also quote other
//! projects' `src/` trees (Kata's, libvirt's in docs/LAUNCHERS.md) and the
//! harness's own `src/` inside the layout block, which are not checked here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness sits in the repository")
        .to_path_buf()
}

/// Every document in docs/ (its Markdown pages).
fn doc_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages
}

/// README.md, CONTRIBUTING.md and every document in docs/: the pages a reader
/// follows links through.
fn markdown_documents() -> Vec<PathBuf> {
    let mut docs = vec![repo().join("README.md"), repo().join("CONTRIBUTING.md")];
    docs.extend(doc_pages());
    docs
}

/// The Markdown documents and Cargo.toml (its comments say why each dependency is
/// there, and where it is used).
fn documents() -> Vec<PathBuf> {
    let mut docs = markdown_documents();
    docs.push(repo().join("Cargo.toml"));
    docs
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap().display().to_string()
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// The tokens of `text` that start with `prefix` (`src/`, `docs/`): at a word
/// boundary (not inside a longer path such as `harness/src/...`), trailing dots and
/// commas left off.
fn paths_under(text: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find(prefix) {
        let start = i + at;
        i = start + prefix.len();
        if start > 0 && is_path_char(bytes[start - 1] as char) {
            continue;
        }
        let end = text[start..]
            .find(|c: char| !is_path_char(c))
            .map_or(text.len(), |n| start + n);
        let token = text[start..end].trim_end_matches(['.', ',']);
        if token.contains("...") || token == prefix {
            continue;
        }
        found.push(token.to_string());
    }
    found
}

/// The `src/...` tokens of `text`.
fn src_paths(text: &str) -> Vec<String> {
    paths_under(text, "src/")
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
        let daemons = src_paths(&text)
            .into_iter()
            .filter(|path| names_the_daemon(path, &own));
        let tests = ["harness/", "vm-tests/"]
            .into_iter()
            .flat_map(|prefix| paths_under(&text, prefix));
        for path in daemons.chain(tests) {
            if !repo().join(&path).exists() {
                missing.push(format!("{}: {path}", shown(&doc)));
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

/// The part of the layout block about `entry` (`src/daemon/`): its line and the
/// indented lines under it, up to the next entry. An entry the block does not list
/// gives nothing.
fn layout_section(block: &str, entry: &str) -> String {
    let mut section = String::new();
    let mut inside = false;
    for line in block.lines() {
        if !line.starts_with(' ') {
            inside = line.starts_with(entry);
        }
        if inside {
            section.push_str(line);
            section.push('\n');
        }
    }
    section
}

/// Each module is named in the layout: a file directly in `src/` anywhere in the
/// block, any other in the section of its directory under `src/` (`memory.rs` under
/// `src/daemon/`, not only under `src/device/`); a directory module (`mod.rs`) by
/// its directory's name.
#[test]
fn the_architecture_layout_names_every_module() {
    let block = layout_block();
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    files.sort();
    let mut left_out = Vec::new();
    for file in files {
        let path = shown(&file);
        let text = match path.split('/').nth(1) {
            Some(dir) if path.matches('/').count() > 1 => {
                layout_section(&block, &format!("src/{dir}/"))
            }
            _ => block.clone(),
        };
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let named = if name == "mod.rs" {
            let dir = file
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy();
            text.contains(&format!("{dir}/"))
        } else {
            text.contains(&name) || has_word(&text, name.trim_end_matches(".rs"))
        };
        if !named {
            left_out.push(path);
        }
    }
    assert!(
        left_out.is_empty(),
        "modules docs/ARCHITECTURE.md's layout block leaves out (each belongs in its \
         directory's lines):\n{}",
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
    let block = "src/a/  one.rs\n  two.rs\nsrc/b/  three.rs\n";
    assert_eq!(
        layout_section(block, "src/a/"),
        "src/a/  one.rs\n  two.rs\n"
    );
    assert_eq!(layout_section(block, "src/c/"), "");
    assert!(!has_word("xattr_ops", "ops"));
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter_map(move |(n, line)| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        (!fenced).then_some((n + 1, line))
    })
}

/// Where in `text` the next run of exactly `len` backticks starts.
fn backtick_run(text: &str, len: usize) -> Option<usize> {
    let mut i = 0;
    while let Some(at) = text[i..].find('`') {
        let start = i + at;
        let run = text[start..].len() - text[start..].trim_start_matches('`').len();
        if run == len {
            return Some(start);
        }
        i = start + run;
    }
    None
}

/// `line` without its code spans: a link written inside one is quoted, not followed.
/// A run of backticks that nothing closes on the line stays as text.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        out.push_str(&rest[..open]);
        let run = rest[open..].len() - rest[open..].trim_start_matches('`').len();
        let inside = &rest[open + run..];
        match backtick_run(inside, run) {
            Some(close) => rest = &inside[close + run..],
            None => {
                out.push_str(&rest[open..open + run]);
                rest = inside;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links (`[label](target)`, images too) in `text`,
/// with their line numbers: outside code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let target = &rest[at + 2..];
            let end = target.find(')').unwrap_or(target.len());
            found.push((n, target[..end].to_string()));
            rest = &target[end..];
        }
    }
    found
}

/// Whether a link's target is a path in this repository (a file, a heading), not
/// an address (`https:`, `mailto:`).
fn is_relative(target: &str) -> bool {
    !target.split(['/', '#']).next().unwrap_or("").contains(':')
}

/// The anchors GitHub gives the headings of a Markdown page: the heading in lower
/// case, without what is neither a letter, a digit, `-` nor `_`, each space a `-`;
/// a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let level = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let heading = line[level..].trim().trim_end_matches('#').trim_end();
        let slug: String = heading
            .chars()
            .flat_map(char::to_lowercase)
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c),
                _ => None,
            })
            .collect();
        let repeats = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(match *repeats {
            0 => slug,
            n => format!("{slug}-{n}"),
        });
        *repeats += 1;
    }
    anchors
}

/// A newcomer reads README.md in five minutes and finds everything else from its
/// Documentation list: every document in docs/, and CONTRIBUTING.md, linked there
/// once. Elsewhere the README names a document without a link; what it (or
/// CONTRIBUTING.md) names under docs/ must exist.
#[test]
fn the_readme_links_every_doc_once() {
    let readme = fs::read_to_string(repo().join("README.md")).unwrap();
    let mut linked: BTreeMap<String, usize> = BTreeMap::new();
    for (_, target) in links(&readme) {
        let file = target.split('#').next().unwrap_or("");
        *linked
            .entry(file.trim_start_matches("./").to_string())
            .or_default() += 1;
    }
    let mut wanted: Vec<String> = doc_pages().iter().map(|page| shown(page)).collect();
    wanted.push("CONTRIBUTING.md".to_string());
    let mut wrong: Vec<String> = wanted
        .iter()
        .filter_map(|doc| {
            let times = linked.get(doc).copied().unwrap_or(0);
            (times != 1).then(|| format!("{doc}: linked {times} times from README.md"))
        })
        .collect();
    for doc in [repo().join("README.md"), repo().join("CONTRIBUTING.md")] {
        let text = fs::read_to_string(&doc).unwrap();
        for path in paths_under(&text, "docs/") {
            if !repo().join(&path).exists() {
                wrong.push(format!(
                    "{}: names {path}, which does not exist",
                    shown(&doc)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "README.md must link each document once:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut broken = Vec::new();
    for doc in markdown_documents() {
        let text = fs::read_to_string(&doc).unwrap();
        for (line, target) in links(&text) {
            if !is_relative(&target) {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = match file {
                "" => doc.clone(),
                file => doc.parent().unwrap().join(file),
            };
            let at = format!("{}:{line}: {target}", shown(&doc));
            if !path.exists() {
                broken.push(format!("{at}: no such file"));
            } else if let Some(anchor) = anchor {
                if path.extension().is_some_and(|e| e == "md")
                    && !anchors(&fs::read_to_string(&path).unwrap()).contains(anchor)
                {
                    broken.push(format!("{at}: no such heading"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_scanner_finds_links_and_headings() {
    let page = "# The control API\n\
                ## `PATCH /volumes/{name}` — change it\n\
                ## Tested\n\
                ## Tested\n\
                [a](docs/A.md#x) `[b](c.md)` ``x`[c](d.md)`` ![i](img.png) [e](https://x/y)\n\
                ```sh\n\
                [f](g.md)\n\
                # not a heading\n\
                ```\n";
    let targets: Vec<String> = links(page).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        targets,
        ["docs/A.md#x", "img.png", "https://x/y"].map(String::from)
    );
    assert_eq!(links(page)[0].0, 5);
    let found = anchors(page);
    let expected: BTreeSet<String> = [
        "the-control-api",
        "patch-volumesname--change-it",
        "tested",
        "tested-1",
    ]
    .map(String::from)
    .into();
    assert_eq!(found, expected);
    assert!(is_relative("#x") && is_relative("../a.md#y") && !is_relative("https://x/y"));
    assert_eq!(
        paths_under("see `docs/A.md`, docs/b/ and xdocs/c", "docs/"),
        ["docs/A.md", "docs/b/"]
    );
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
