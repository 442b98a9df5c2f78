//! OneBot message content: segment arrays, and the older CQ-code strings
//! (`[CQ:reply,id=1][CQ:at,qq=2] hi &amp; bye`), both turned into one list of segments.

use serde_json::{Map, Value};

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub kind: String,
    pub data: Vec<(String, String)>,
}

impl Segment {
    pub fn text(text: &str) -> Self {
        Self {
            kind: "text".into(),
            data: vec![("text".into(), text.into())],
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.data
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Reverses CQ escaping of text (`&amp;`, `&#91;`, `&#93;`) and parameter values (also `&#44;`).
pub fn unescape(s: &str) -> String {
    s.replace("&#44;", ",")
        .replace("&#91;", "[")
        .replace("&#93;", "]")
        .replace("&amp;", "&")
}

/// Escapes text for a CQ string.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('[', "&#91;")
        .replace(']', "&#93;")
}

/// Escapes a CQ code's parameter value: as text, and its commas too.
pub fn escape_value(s: &str) -> String {
    escape(s).replace(',', "&#44;")
}

/// Writes segments as a CQ-code string, which [`parse_cq`] reads back as the same segments
/// (adjacent texts as one).
pub fn to_cq(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        if segment.kind == "text" {
            out.push_str(&escape(segment.get("text").unwrap_or_default()));
            continue;
        }
        out.push_str("[CQ:");
        out.push_str(&segment.kind);
        for (key, value) in &segment.data {
            out.push(',');
            out.push_str(key);
            out.push('=');
            out.push_str(&escape_value(value));
        }
        out.push(']');
    }
    out
}

/// Parses a CQ-code string into segments. Malformed codes are kept as text.
pub fn parse_cq(input: &str) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        match rest.find("[CQ:") {
            None => {
                segments.push(Segment::text(&unescape(rest)));
                break;
            }
            Some(start) => {
                if start > 0 {
                    segments.push(Segment::text(&unescape(&rest[..start])));
                }
                let after = &rest[start..];
                let Some(end) = after.find(']') else {
                    segments.push(Segment::text(&unescape(after)));
                    break;
                };
                let code = &after[4..end];
                let mut parts = code.split(',');
                let kind = parts.next().unwrap_or_default().trim().to_owned();
                let data = parts
                    .filter_map(|p| p.split_once('='))
                    .map(|(k, v)| (k.trim().to_owned(), unescape(v)))
                    .collect();
                if kind.is_empty() {
                    segments.push(Segment::text(&unescape(&after[..=end])));
                } else {
                    segments.push(Segment { kind, data });
                }
                rest = &after[end + 1..];
            }
        }
    }
    segments
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Parses a segment array (`[{"type": "text", "data": {"text": "hi"}}]`). Entries that are not
/// segments are skipped.
pub fn parse_array(items: &[Value]) -> Vec<Segment> {
    items
        .iter()
        .filter_map(|item| {
            let kind = item.get("type")?.as_str()?.to_owned();
            let data = item
                .get("data")
                .and_then(Value::as_object)
                .map(|d: &Map<String, Value>| {
                    d.iter()
                        .filter_map(|(k, v)| scalar(v).map(|v| (k.clone(), v)))
                        .collect()
                })
                .unwrap_or_default();
            Some(Segment { kind, data })
        })
        .collect()
}

/// Parses a `message` field in either form.
pub fn parse_message(message: &Value) -> Vec<Segment> {
    match message {
        Value::String(s) => parse_cq(s),
        Value::Array(items) => parse_array(items),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cq_string_and_a_segment_array_give_the_same_segments() {
        let cq = parse_cq("[CQ:reply,id=-12][CQ:at,qq=42] hello &amp; &#91;world&#93;");
        let array = parse_array(
            json!([
                {"type": "reply", "data": {"id": -12}},
                {"type": "at", "data": {"qq": "42"}},
                {"type": "text", "data": {"text": " hello & [world]"}}
            ])
            .as_array()
            .expect("array"),
        );
        assert_eq!(cq, array);
        assert_eq!(cq[0].get("id"), Some("-12"));
    }

    #[test]
    fn parameters_unescape_commas_and_malformed_codes_stay_text() {
        let segs = parse_cq("[CQ:share,title=a&#44;b,url=x]");
        assert_eq!(segs[0].get("title"), Some("a,b"));
        assert_eq!(parse_cq("[CQ:oops"), vec![Segment::text("[CQ:oops")]);
        assert_eq!(escape("a & [b]"), "a &amp; &#91;b&#93;");
        assert_eq!(unescape(&escape("x & [y], z")), "x & [y], z");
    }

    #[test]
    fn segments_written_as_cq_codes_read_back_as_themselves() {
        let segments = vec![
            Segment {
                kind: "share".into(),
                data: vec![
                    ("url".into(), "https://a.b/?x=1,2&y=[3]".into()),
                    ("title".into(), "a, b".into()),
                ],
            },
            Segment::text(" [CQ:at,qq=1] & more"),
        ];
        let written = to_cq(&segments);
        assert_eq!(
            written,
            "[CQ:share,url=https://a.b/?x=1&#44;2&amp;y=&#91;3&#93;,title=a&#44; b] &#91;CQ:at,qq=1&#93; &amp; more"
        );
        assert_eq!(parse_cq(&written), segments);
    }
}
