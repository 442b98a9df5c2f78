//! The AFL++ target `cron`: see [`hark_fuzz::cron`].

fn main() {
    afl::fuzz!(|data: &[u8]| hark_fuzz::cron(data));
}
