//! The AFL++ target `shape`: see [`hark_fuzz::shape`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::shape(data));
}
