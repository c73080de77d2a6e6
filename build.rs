//! Compiles the namespace sandbox's tiny supervisor (src/sandbox/tiny_supervisor.c),
//! which the binary embeds and executes from a memfd. x86_64 Linux only (its system
//! calls are inline assembly); elsewhere the supervisor re-executes volfsd itself.
//!
//! The system C compiler (`CC`, else `cc`) is called directly rather than through
//! the `cc` crate: it is one command with fixed flags, and `cc` is already needed as
//! the linker of every Rust program on Linux.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/sandbox/tiny_supervisor.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CC");
    let target = |v: &str| std::env::var(v).unwrap_or_default();
    if target("CARGO_CFG_TARGET_ARCH") != "x86_64" || target("CARGO_CFG_TARGET_OS") != "linux" {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("tiny_supervisor");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    // Static and freestanding: no loader, no libc, no PIE relocation, no unwind
    // tables or build id (bytes for nothing), symbols stripped.
    let status = Command::new(&cc)
        .args([
            "-static",
            "-nostdlib",
            "-ffreestanding",
            "-fno-pie",
            "-no-pie",
            "-Os",
            "-fno-stack-protector",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-fcf-protection=none",
            "-Wall",
            "-Werror",
            "-s",
            "-Wl,--build-id=none",
            "-Wl,-z,noexecstack",
            "-o",
        ])
        .arg(&out)
        .arg(SOURCE)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?} for {SOURCE}: {e}"));
    assert!(
        status.success(),
        "{cc:?} failed to compile {SOURCE}: {status}"
    );
}
