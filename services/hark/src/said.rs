//! What the command line says to a person, in Chinese or English: Chinese when the locale
//! (`LC_ALL`, else `LC_MESSAGES`, else `LANG`) is Chinese, as `zh_CN.UTF-8` is, English
//! otherwise. Every message is written in both at once, with [`said!`], so none can lack one.

use std::sync::OnceLock;

/// Whether the person reads Chinese, by the locale of `var`.
pub fn chinese_in(var: impl Fn(&str) -> Option<String>) -> bool {
    ["LC_ALL", "LC_MESSAGES", "LANG"]
        .iter()
        .find_map(|name| var(name).filter(|v| !v.is_empty()))
        .is_some_and(|locale| locale.to_ascii_lowercase().starts_with("zh"))
}

/// Whether this process speaks Chinese.
pub fn zh() -> bool {
    static ZH: OnceLock<bool> = OnceLock::new();
    *ZH.get_or_init(|| chinese_in(|name| std::env::var(name).ok()))
}

/// A message in the person's language: `said!(zh: "…{x}…", en: "…{x}…")`, each a format string
/// with the same arguments.
#[macro_export]
macro_rules! said {
    (zh: $zh:literal, en: $en:literal $(, $arg:expr)* $(,)?) => {
        if $crate::said::zh() {
            format!($zh $(, $arg)*)
        } else {
            format!($en $(, $arg)*)
        }
    };
}

/// Writes a line to stdout as `println!` does, except that a reader that went away
/// (`hark task list | head -1`) ends hark as it ends other command-line tools: quietly, with
/// the status a shell gives a pipe's writer (141), instead of a panic.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let written = writeln!(std::io::stdout().lock(), $($arg)*);
        if let Err(e) = written {
            $crate::said::stdout_failed(e);
        }
    }};
}

/// Writes `bytes` to stdout, as [`out!`] writes a line.
pub fn out_bytes(bytes: &[u8]) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        stdout_failed(e);
    }
}

/// Ends hark after stdout failed: quietly when its reader went away.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        eprintln!(
            "{}",
            said!(zh: "hark：无法写入标准输出：{}", en: "hark: cannot write to stdout: {}", e)
        );
        std::process::exit(1);
    }
    std::process::exit(141)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locale_picks_the_language() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            chinese_in(move |name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            })
        };
        assert!(with(&[("LANG", "zh_CN.UTF-8")]));
        assert!(with(&[("LC_ALL", "zh_TW.UTF-8"), ("LANG", "en_US.UTF-8")]));
        assert!(!with(&[("LANG", "en_GB.UTF-8")]));
        assert!(!with(&[("LC_ALL", "C.UTF-8"), ("LANG", "zh_CN.UTF-8")]));
        assert!(!with(&[]));
    }
}
