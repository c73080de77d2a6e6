//! AFL++ persistent-mode entry of the `region` target (see `volfsd_fuzz::region`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        volfsd_fuzz::run_region(data);
    });
}
