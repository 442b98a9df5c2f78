//! Formatting of chat text that does not depend on its language: splitting a long text into
//! platform messages, clipping, durations. The texts themselves are in [`crate::texts`].

/// A platform message longer than this is split.
pub const PART_CHARS: usize = 1000;
/// At most this many parts are sent; the rest is cut.
pub const MAX_PARTS: usize = 5;

/// Splits a long text into at most [`MAX_PARTS`] parts of at most [`PART_CHARS`] characters,
/// preferring to break at a line end. Text beyond the last part is cut and marked with `…`.
pub fn parts(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.trim().chars().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    while start < chars.len() && parts.len() < MAX_PARTS {
        let mut end = (start + PART_CHARS).min(chars.len());
        if end < chars.len() {
            if parts.len() + 1 == MAX_PARTS {
                end = start + PART_CHARS - 1;
                let mut last: String = chars[start..end].iter().collect();
                last.push('…');
                parts.push(last);
                break;
            }
            if let Some(nl) = chars[start..end].iter().rposition(|c| *c == '\n')
                && nl > PART_CHARS / 2
            {
                end = start + nl + 1;
            }
        }
        parts.push(
            chars[start..end]
                .iter()
                .collect::<String>()
                .trim_end()
                .to_owned(),
        );
        start = end;
    }
    if parts.is_empty() {
        parts.push(String::new());
    }
    parts
}

/// `text` cut to `max` characters, with `…` when cut, on one line.
pub fn clip(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// A duration rounded to whole seconds, as `1h30m` or `45s`.
pub fn human(duration: std::time::Duration) -> String {
    hark_core::domain::HumanDuration(std::time::Duration::from_secs(duration.as_secs())).to_string()
}

/// What the model receives when its question expired without an answer.
pub fn expiry_notice(waited: std::time::Duration) -> String {
    format!(
        "No answer came within {}. Continue without it: make a reasonable assumption and say so, or ask again if you cannot go on.",
        human(waited)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_split_into_at_most_five_parts_of_at_most_1000_chars() {
        assert_eq!(parts("short"), vec!["short".to_owned()]);
        let long = "字".repeat(2500);
        let split = parts(&long);
        assert_eq!(split.len(), 3);
        assert!(split.iter().all(|p| p.chars().count() <= PART_CHARS));
        assert_eq!(split.concat().chars().count(), 2500);

        let huge = "x".repeat(7000);
        let split = parts(&huge);
        assert_eq!(split.len(), MAX_PARTS);
        assert!(split.iter().all(|p| p.chars().count() <= PART_CHARS));
        assert!(split.last().expect("parts").ends_with('…'));
    }

    #[test]
    fn splitting_prefers_line_ends() {
        let text = format!("{}\n{}", "a".repeat(700), "b".repeat(700));
        let split = parts(&text);
        assert_eq!(split, vec!["a".repeat(700), "b".repeat(700)]);
    }
}
