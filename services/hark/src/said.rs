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
