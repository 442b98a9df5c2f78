//! The AFL++ target `http`: see [`hark_fuzz::http`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::http(data));
}
