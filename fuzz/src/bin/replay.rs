//! Runs inputs through a target without AFL, for triage:
//! `cargo run --release --manifest-path fuzz/Cargo.toml --bin replay -- TARGET FILE...`
//! (`VOLFSD_FUZZ_TRACE=1` prints each request's outcome).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((target, files)) = args.split_first() else {
        eprintln!("usage: replay TARGET FILE...");
        std::process::exit(2);
    };
    let Some((_, run)) = volfsd_fuzz::TARGETS.iter().find(|(n, _)| n == target) else {
        eprintln!("unknown target {target}");
        std::process::exit(2);
    };
    for f in files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        run(&data);
        println!("ok {f}");
    }
}
