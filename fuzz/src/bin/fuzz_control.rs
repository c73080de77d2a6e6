//! AFL++ persistent-mode entry of the `control` target (see `volfsd_fuzz::control`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        volfsd_fuzz::run_control(data);
    });
}
