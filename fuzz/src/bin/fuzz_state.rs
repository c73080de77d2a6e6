//! AFL++ persistent-mode entry of the `state` target (see `volfsd_fuzz::state`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        volfsd_fuzz::run_state(data);
    });
}
