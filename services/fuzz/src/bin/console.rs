//! The AFL++ target `console`: see [`hark_fuzz::console`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::console(data));
}
