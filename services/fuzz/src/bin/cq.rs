//! The AFL++ target `cq`: see [`hark_fuzz::cq`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::cq(data));
}
