//! AFL++ persistent-mode entry of the `paths` target (see `volfsd_fuzz::paths`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        volfsd_fuzz::run_paths(data);
    });
}
