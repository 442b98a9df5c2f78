//! Bounds on what people send, the same on every surface: a goal, an answer or an instruction is
//! refused past the same size whether it came by chat or over gRPC.

/// The most bytes of a goal, an answer or an instruction.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// The most bytes of a short note: a cancel reason, an author.
pub const MAX_NOTE_BYTES: usize = 1024;
/// The most bytes of an identifier a caller chooses: a request id, a platform message id.
pub const MAX_KEY_BYTES: usize = 256;

/// Why a text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("must not be empty")]
    Empty,
    #[error("is {len} bytes, longer than the {max} allowed")]
    TooLong { len: usize, max: usize },
    #[error("contains a NUL character (\\0), which cannot be stored")]
    Nul,
    #[error("contains a control character; an identifier must be printable")]
    Control,
}

/// The largest index at most `at` that starts a character of `text`: where to cut it.
pub fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// A text, trimmed, that is not empty, not longer than `max` bytes and has no NUL.
pub fn text(value: &str, max: usize) -> Result<&str, TextError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(TextError::Empty);
    }
    bounded(trimmed, max)
}

/// Like [`text`], but empty is allowed.
pub fn optional_text(value: &str, max: usize) -> Result<&str, TextError> {
    bounded(value.trim(), max)
}

/// An identifier a caller chose, possibly empty: at most [`MAX_KEY_BYTES`], printable.
pub fn key(value: &str) -> Result<&str, TextError> {
    if value.len() > MAX_KEY_BYTES {
        return Err(TextError::TooLong {
            len: value.len(),
            max: MAX_KEY_BYTES,
        });
    }
    if value.contains('\0') {
        return Err(TextError::Nul);
    }
    if value.chars().any(char::is_control) {
        return Err(TextError::Control);
    }
    Ok(value)
}

pub fn bounded(value: &str, max: usize) -> Result<&str, TextError> {
    if value.len() > max {
        return Err(TextError::TooLong {
            len: value.len(),
            max,
        });
    }
    if value.contains('\0') {
        return Err(TextError::Nul);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_trimmed_bounded_and_free_of_nul() {
        assert_eq!(text("  go  ", 10), Ok("go"));
        assert_eq!(text("   ", 10), Err(TextError::Empty));
        assert_eq!(optional_text("   ", 10), Ok(""));
        assert_eq!(
            text(&"x".repeat(11), 10),
            Err(TextError::TooLong { len: 11, max: 10 })
        );
        assert_eq!(text("a\0b", 10), Err(TextError::Nul));
        assert_eq!(key("req-1"), Ok("req-1"));
        assert_eq!(key(""), Ok(""));
        assert_eq!(key("a\nb"), Err(TextError::Control));
        assert_eq!(key("a\0b"), Err(TextError::Nul));
        assert!(key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
    }
}
