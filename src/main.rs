//! The `volfsd` binary: everything is in the library (`cli.rs`).

fn main() -> std::process::ExitCode {
    volfsd::main()
}
