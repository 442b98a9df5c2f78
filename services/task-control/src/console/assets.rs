//! The console's page: one HTML file, one script and one style sheet, built into the binary so
//! that it works with no network beyond task-control.

use axum::{
    extract::Path,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// `GET /`.
pub async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
        .into_response()
}

/// `GET /assets/{name}`.
pub async fn file(Path(name): Path<String>) -> Response {
    let (kind, body) = match name.as_str() {
        "app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "app.css" => ("text/css; charset=utf-8", STYLE),
        _ => return (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The keys of the `lang: { … }` table of `table` in the console's script.
    fn keys(table: &str, lang: &str) -> BTreeSet<String> {
        let start = super::SCRIPT
            .find(&format!("const {table} = {{"))
            .unwrap_or_else(|| panic!("the script has {table}"));
        let body = &super::SCRIPT[start..];
        let open = body
            .find(&format!("{lang}: {{"))
            .unwrap_or_else(|| panic!("{table} has {lang}"));
        let inner = &body[open + lang.len() + 3..];
        let mut depth = 1;
        let end = inner
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map(|(i, _)| i)
            .expect("the table ends");
        let mut found = BTreeSet::new();
        let mut rest = &inner[..end];
        // `key: "text"`, with texts that may hold `:` themselves.
        while let Some(colon) = rest.find(": \"") {
            let key: String = rest[..colon]
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let after = &rest[colon + 3..];
            // Skip the text, its escaped quotes included.
            let mut escaped = false;
            let close = after
                .char_indices()
                .find(|(_, c)| {
                    let end = *c == '"' && !escaped;
                    escaped = *c == '\\' && !escaped;
                    end
                })
                .map(|(i, _)| i)
                .expect("the text ends");
            if !key.is_empty() {
                found.insert(key);
            }
            rest = &after[close + 1..];
        }
        found
    }

    #[test]
    fn every_console_text_exists_in_chinese_and_english() {
        for table in ["TEXTS", "STATE_NAMES"] {
            let (en, zh) = (keys(table, "en"), keys(table, "zh"));
            assert!(en.len() > 5, "{table}: {en:?}");
            assert_eq!(
                en.symmetric_difference(&zh).collect::<Vec<_>>(),
                Vec::<&String>::new(),
                "{table}: keys in one language only"
            );
        }
    }
}
