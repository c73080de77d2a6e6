//! What a queue worker's seccomp filter costs per system call: the same calls timed
//! in a thread without a filter and in a thread under the Worker role's filters
//! (`src/sandbox/seccomp.rs`), alternately, several rounds. Calls the filter allows
//! unconditionally are answered from the kernel's per-filter cache; calls with an
//! argument rule (fcntl here) run the filter program.
//!
//! `cargo bench -p volfsd-harness --bench seccomp_cost [-- --json FILE]`; run by
//! benches/compare.sh, reported in docs/BENCHMARKS.md. Output: one line per call,
//! the median ns over the rounds without and with the filter.

use std::os::fd::AsRawFd;
use std::time::Instant;

use volfsd::exports::sandbox::{seccomp, SeccompMode, ThreadRole};

const CALLS: u64 = 1_000_000;
const ROUNDS: usize = 7;

/// ns per call of `f`, over CALLS calls.
fn per_call(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..CALLS {
        f();
    }
    t.elapsed().as_nanos() as f64 / CALLS as f64
}

/// (fstat, preadv, fcntl(F_GETFL)) ns per call, in a new thread, filtered or not.
fn round(filtered: bool) -> [f64; 3] {
    std::thread::spawn(move || {
        let file = std::fs::File::open("/proc/self/exe").expect("open");
        let fd = file.as_raw_fd();
        if filtered {
            seccomp::apply(ThreadRole::Worker, SeccompMode::Kill).expect("worker filter");
        }
        // SAFETY (all three): plain syscalls on an fd this thread owns, into local
        // buffers of the right size.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let mut buf = [0u8; 64];
        let fstat = per_call(&mut || unsafe {
            libc::fstat(fd, &mut st);
        });
        let preadv = per_call(&mut || unsafe {
            let iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            libc::preadv(fd, &iov, 1, 0);
        });
        let fcntl = per_call(&mut || unsafe {
            libc::fcntl(fd, libc::F_GETFL);
        });
        [fstat, preadv, fcntl]
    })
    .join()
    .expect("bench thread")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        off.push(round(false));
        on.push(round(true));
    }
    let names = [
        "fstat (cached allow)",
        "preadv (cached allow)",
        "fcntl F_GETFL (argument rule)",
    ];
    let mut rows = Vec::new();
    println!(
        "{:<32} {:>12} {:>12} {:>10}",
        "system call", "no filter", "worker", "extra ns"
    );
    for (i, name) in names.iter().enumerate() {
        let a = median(off.iter().map(|r| r[i]).collect());
        let b = median(on.iter().map(|r| r[i]).collect());
        println!("{name:<32} {a:>12.0} {b:>12.0} {:>10.0}", b - a);
        rows.push(format!(
            "{{\"call\":\"{name}\",\"no_filter_ns\":{a:.1},\"worker_filter_ns\":{b:.1}}}"
        ));
    }
    if let Some(path) = json {
        std::fs::write(&path, format!("[{}]\n", rows.join(","))).expect("write json");
    }
}
