//! The AFL++ target `satori`: see [`hark_fuzz::satori`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::satori(data));
}
