//! The AFL++ target `onebot`: see [`hark_fuzz::onebot`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::onebot(data));
}
