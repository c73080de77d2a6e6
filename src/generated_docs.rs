//! Tables in docs/ generated from the code they describe (the seccomp lists, the
//! FUSE operations): a unit test checks each is current, and rewrites it when
//! `VOLFSD_UPDATE_DOCS` is set.

/// Checks that `doc` (relative to the repository) holds `table` between the markers
/// `<!-- BEGIN NAME ... -->` and `<!-- END NAME -->`; rewrites it there under
/// `VOLFSD_UPDATE_DOCS=1`, else panics naming the doc.
pub fn keep_current(doc: &str, begin: &str, end: &str, table: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (head, rest) = text
        .split_once(begin)
        .unwrap_or_else(|| panic!("{doc} has no marker {begin:?}"));
    let (current, tail) = rest
        .split_once(end)
        .unwrap_or_else(|| panic!("{doc} has no marker {end:?}"));
    if current == table {
        return;
    }
    if std::env::var_os("VOLFSD_UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{head}{begin}{table}{end}{tail}")).unwrap();
        return;
    }
    panic!("{doc} is out of date with the code: rerun the test with VOLFSD_UPDATE_DOCS=1");
}
