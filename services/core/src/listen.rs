//! Says where a role listens once it bound, so that a listener configured on port 0 can be
//! found: in the log at DEBUG, and, when `HARK_ADDR_FILE` names a file, as one line
//! `<config key> <address>` appended to it (`control.grpc_listen 127.0.0.1:41234`). A
//! supervisor or a test that starts hark on port 0 reads the last line of the key it wants.

use std::{io::Write, net::SocketAddr};

/// The variable naming the file each bound listener is written to.
pub const ENV_ADDR_FILE: &str = "HARK_ADDR_FILE";

/// Reports that the listener of config key `key` is bound to `addr`.
pub fn bound(key: &str, addr: SocketAddr) {
    tracing::debug!(%addr, key, "listening");
    let Some(path) = std::env::var_os(ENV_ADDR_FILE).filter(|p| !p.is_empty()) else {
        return;
    };
    // One write of one short line to a file opened for appending: lines of several roles of
    // one process, or of several processes, never interleave.
    let line = format!("{key} {addr}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        tracing::warn!(
            error = %e,
            file = %std::path::Path::new(&path).display(),
            "cannot write the bound address to {ENV_ADDR_FILE}; unset it or make the file writable"
        );
    }
}

/// The last address written for `key` in the text of an address file.
pub fn last(text: &str, key: &str) -> Option<SocketAddr> {
    text.lines()
        .rev()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, addr)| addr.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_of_a_key_wins_and_other_keys_are_skipped() {
        let text = "control.grpc_listen 127.0.0.1:1000\n\
                    gateway.listen 127.0.0.1:2000\n\
                    control.grpc_listen 127.0.0.1:3000\n\
                    metrics.listen not-an-address\n";
        assert_eq!(
            last(text, "control.grpc_listen"),
            Some("127.0.0.1:3000".parse().unwrap())
        );
        assert_eq!(
            last(text, "gateway.listen"),
            Some("127.0.0.1:2000".parse().unwrap())
        );
        assert_eq!(last(text, "metrics.listen"), None);
        assert_eq!(last(text, "control.http_listen"), None);
    }
}
