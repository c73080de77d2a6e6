//! AFL++ persistent-mode entry of the `fuse` target (see `volfsd_fuzz::fuse`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        volfsd_fuzz::run_fuse(data);
    });
}
