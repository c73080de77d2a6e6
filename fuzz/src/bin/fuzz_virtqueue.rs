//! AFL++ persistent-mode entry of the `virtqueue` target (see `volfsd_fuzz::virtqueue`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        volfsd_fuzz::run_virtqueue(data);
    });
}
