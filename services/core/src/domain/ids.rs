//! Identifier newtypes, each parsed where data enters hark.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// Why a value could not be taken as an identifier. The message names the kind of value and the
/// expected shape, so it can be shown to the person who typed it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("`{0}` is not a task id: expected a UUID such as 0190a3f2-7c4e-7d21-9a0b-5b2f1e8c9d70")]
    TaskId(String),
    #[error(
        "`{0}` is not a task id or id prefix: expected at least 4 hex characters of a task's id"
    )]
    TaskRef(String),
    #[error("`{0}` is not a question id: expected a UUID")]
    QuestionId(String),
    #[error(
        "`{0}` is not an owner: expected `platform:user_id`, e.g. `qq:10001` (platform in a-z, 0-9, _ or -)"
    )]
    Owner(String),
    #[error("`{0}` is not a chat stream: expected `group:<id>` or `private:<user id>`")]
    Stream(String),
    #[error("`{0}` is not a question handle: expected 2 to 8 letters or digits, e.g. `a3f9`")]
    Handle(String),
    #[error("`{0}` is not a role: expected `admin`, `user` or `guest`")]
    Role(String),
    #[error(
        "`{value}` is not a usable {field}: expected 1 to {max} bytes without spaces, control or \
         format characters{extra}"
    )]
    ChatId {
        field: &'static str,
        value: String,
        max: usize,
        extra: &'static str,
    },
}

/// The most bytes of an id a chat platform gives hark (a message, user, group or bot id).
pub const MAX_CHAT_ID_BYTES: usize = 128;

/// Whether `c` is a Unicode format character (general category Cf): invisible, and able to
/// reorder how text around it is shown (U+202E), so never part of an id.
pub fn is_format(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2
        | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
        | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F)
}

/// Whether `c` may be part of an id: it is visible and no separator.
fn is_id_char(c: char) -> bool {
    !(c.is_whitespace() || c.is_control() || is_format(c))
}

/// Checks an id a platform gave hark (`field` names it in the error): 1 to
/// [`MAX_CHAT_ID_BYTES`] bytes of visible characters.
pub fn chat_id<'a>(field: &'static str, value: &'a str) -> Result<&'a str, IdError> {
    if !value.is_empty() && value.len() <= MAX_CHAT_ID_BYTES && value.chars().all(is_id_char) {
        Ok(value)
    } else {
        Err(IdError::ChatId {
            field,
            value: shown(value),
            max: MAX_CHAT_ID_BYTES,
            extra: "",
        })
    }
}

/// Checks a bot's id, which names a subject and a consumer: 1 to 64 of a-z, A-Z, 0-9, `_`
/// and `-`.
pub fn bot_id<'a>(field: &'static str, value: &'a str) -> Result<&'a str, IdError> {
    if !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        Ok(value)
    } else {
        Err(IdError::ChatId {
            field,
            value: shown(value),
            max: 64,
            extra: " (a bot's id takes only a-z, A-Z, 0-9, _ and -)",
        })
    }
}

/// The most characters of someone's input an error or a reply repeats.
pub const SHOWN_CHARS: usize = 40;

/// Input as an error message or a chat reply repeats it: at most [`SHOWN_CHARS`] characters
/// (cut with `…`), on one line, without control characters. A reply never echoes a flood back.
pub fn shown(input: &str) -> String {
    let mut out = String::new();
    for (i, c) in input.chars().enumerate() {
        if i == SHOWN_CHARS {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

/// `input` on one line: control characters (line breaks included) become spaces, and format
/// characters that could reorder how it shows are dropped.
pub fn one_line(input: &str) -> String {
    input
        .chars()
        .filter(|c| !is_format(*c))
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $err:ident, $make:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            pub fn new() -> Self {
                Self($make)
            }

            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// The first 8 hex characters, as chat replies show it.
            pub fn short(&self) -> String {
                self.0.simple().to_string()[..8].to_owned()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s.trim())
                    .map(Self)
                    .map_err(|_| IdError::$err(shown(s)))
            }
        }

        impl From<Uuid> for $name {
            fn from(uuid: Uuid) -> Self {
                Self(uuid)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }
    };
}

uuid_id!(
    /// A task's id: a random UUID, so that its first 8 hex characters, which chat replies show,
    /// tell tasks apart (a time-ordered id would share them across a minute).
    TaskId,
    TaskId,
    Uuid::new_v4()
);
uuid_id!(
    /// A question's id: time-ordered, so questions page in the order they were asked.
    QuestionId,
    QuestionId,
    Uuid::now_v7()
);

/// A task named by a person: its full id or a prefix of its hex digits (hyphens ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskRef {
    Full(TaskId),
    /// Lower-case hex digits without hyphens, at least 4 of them.
    Prefix(String),
}

impl TaskRef {
    pub const MIN_PREFIX: usize = 4;
}

impl FromStr for TaskRef {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim().trim_start_matches('#');
        if let Ok(id) = trimmed.parse::<TaskId>() {
            return Ok(Self::Full(id));
        }
        let hex: String = trimmed
            .chars()
            .filter(|c| *c != '-')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if hex.len() >= Self::MIN_PREFIX
            && hex.len() < 32
            && hex.chars().all(|c| c.is_ascii_hexdigit())
        {
            Ok(Self::Prefix(hex))
        } else {
            Err(IdError::TaskRef(shown(s)))
        }
    }
}

fn is_platform_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
}

/// Who a task belongs to: `platform:user_id`, compared exactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner(String);

impl Owner {
    pub fn new(platform: &str, user_id: &str) -> Result<Self, IdError> {
        format!("{platform}:{user_id}").parse()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn platform(&self) -> &str {
        self.0.split_once(':').map_or("", |(p, _)| p)
    }

    pub fn user_id(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, u)| u)
    }

    /// Whether a message from `user_id` on `platform` may speak for this owner. With a known
    /// platform the comparison is exact; where the platform is unknown (empty) the seed's rule
    /// applies and only the `:user_id` suffix is compared.
    pub fn is_sender(&self, platform: &str, user_id: &str) -> bool {
        if user_id.is_empty() {
            return false;
        }
        if platform.is_empty() {
            self.user_id() == user_id
        } else {
            self.platform() == platform && self.user_id() == user_id
        }
    }
}

impl FromStr for Owner {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IdError::Owner(shown(s));
        let (platform, user) = s.split_once(':').ok_or_else(err)?;
        let platform_ok =
            !platform.is_empty() && platform.len() <= 32 && platform.chars().all(is_platform_char);
        let user_ok = !user.is_empty() && user.len() <= 128 && user.chars().all(is_id_char);
        if platform_ok && user_ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(err())
        }
    }
}

impl TryFrom<String> for Owner {
    type Error = IdError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Owner {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Owner {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A conversation on a platform: `group:<id>` or `private:<user id>`; other kinds (`channel:…`)
/// are accepted for platforms that have them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(String);

impl StreamId {
    pub fn group(id: &str) -> Result<Self, IdError> {
        format!("group:{id}").parse()
    }

    pub fn private(user_id: &str) -> Result<Self, IdError> {
        format!("private:{user_id}").parse()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn kind(&self) -> &str {
        self.0.split_once(':').map_or("", |(k, _)| k)
    }

    pub fn target(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, t)| t)
    }

    pub fn is_group(&self) -> bool {
        self.kind() == "group"
    }
}

impl FromStr for StreamId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IdError::Stream(shown(s));
        let (kind, target) = s.split_once(':').ok_or_else(err)?;
        let kind_ok =
            !kind.is_empty() && kind.len() <= 16 && kind.chars().all(|c| c.is_ascii_lowercase());
        let target_ok = !target.is_empty() && target.len() <= 128 && target.chars().all(is_id_char);
        if kind_ok && target_ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(err())
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The short handle of a question, shown in the chat as `#a3f9`. It is unique among the open
/// questions of one owner in one stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Handle(String);

impl Handle {
    pub const LEN: usize = 4;

    /// A random handle of [`Handle::LEN`] lower-case hex characters.
    pub fn random() -> Self {
        let hex = Uuid::new_v4().simple().to_string();
        Self(hex[..Self::LEN].to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Splits `#a3f9 the answer` into the handle and the rest of the text, if the text starts
    /// with something shaped like a handle.
    pub fn strip_prefix(text: &str) -> Option<(Handle, &str)> {
        let rest = text.trim_start().strip_prefix('#')?;
        let end = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        let handle = rest[..end].parse().ok()?;
        let after = rest[end..]
            .trim_start_matches([':', ',', '，', '：'])
            .trim();
        Some((handle, after))
    }
}

impl FromStr for Handle {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().trim_start_matches('#');
        if (2..=8).contains(&t.len()) && t.chars().all(|c| c.is_ascii_alphanumeric()) {
            Ok(Self(t.to_ascii_lowercase()))
        } else {
            Err(IdError::Handle(shown(s)))
        }
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a person may do. Ordered: `Guest < User < Admin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// May talk to the bot but not create tasks.
    Guest,
    /// May create tasks, which may ask questions.
    User,
    /// May also see and cancel everyone's tasks.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Guest => "guest",
            Role::User => "user",
            Role::Admin => "admin",
        }
    }
}

impl TryFrom<String> for Role {
    type Error = IdError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl FromStr for Role {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "guest" => Ok(Role::Guest),
            "user" => Ok(Role::User),
            "admin" => Ok(Role::Admin),
            _ => Err(IdError::Role(shown(s))),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_need_a_platform_and_a_user_id() {
        assert!("qq:10001".parse::<Owner>().is_ok());
        assert!("api:alice@example.org".parse::<Owner>().is_ok());
        for bad in ["", "qq", "qq:", ":10001", "QQ:1", "qq:1 2", "q q:1"] {
            assert!(bad.parse::<Owner>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn owners_and_streams_refuse_format_characters_that_spoof_how_they_show() {
        for bad in [
            "qq:1\u{202E}0001",
            "qq:\u{200B}10001",
            "qq:1\u{FEFF}",
            "qq:1\u{E0041}",
        ] {
            assert!(bad.parse::<Owner>().is_err(), "{bad:?} parsed");
        }
        assert!("group:7\u{202E}7".parse::<StreamId>().is_err());
        assert!("qq:用户一".parse::<Owner>().is_ok());
    }

    #[test]
    fn chat_ids_are_bounded_visible_and_bot_ids_fit_a_subject() {
        assert_eq!(chat_id("message_id", "-2147480000"), Ok("-2147480000"));
        assert!(chat_id("message_id", "AbC=/+_x").is_ok());
        for bad in ["", "1\n2", "1 2", "1\r", "a\u{202E}b", &"9".repeat(129)] {
            let e = chat_id("message_id", bad).expect_err(bad);
            assert!(e.to_string().contains("message_id"), "{e}");
        }
        assert!(bot_id("self_id", "10001").is_ok());
        for bad in ["", "a/b", "a.b", "a*", "a>", "1 2", &"1".repeat(65)] {
            assert!(bot_id("self_id", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_known_platform_is_compared_exactly_and_an_unknown_one_by_suffix() {
        let owner: Owner = "qq:10001".parse().expect("owner");
        assert!(owner.is_sender("qq", "10001"));
        assert!(!owner.is_sender("wechat", "10001"));
        assert!(!owner.is_sender("qq", "1000"));
        assert!(!owner.is_sender("qq", "100011"));
        assert!(owner.is_sender("", "10001"));
        assert!(!owner.is_sender("", "0001"));
        assert!(!owner.is_sender("", ""));
    }

    #[test]
    fn task_refs_accept_full_ids_and_hex_prefixes() {
        let id = TaskId::new();
        assert_eq!(id.to_string().parse::<TaskRef>(), Ok(TaskRef::Full(id)));
        assert_eq!(
            "0190A3F2".parse::<TaskRef>(),
            Ok(TaskRef::Prefix("0190a3f2".into()))
        );
        assert_eq!(
            "0190a3f2-7c".parse::<TaskRef>(),
            Ok(TaskRef::Prefix("0190a3f27c".into()))
        );
        for bad in ["", "abc", "xyz1", "12 34"] {
            assert!(bad.parse::<TaskRef>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(id.short().len(), 8);
        assert!(id.to_string().starts_with(&id.short()));
    }

    #[test]
    fn streams_have_a_kind_and_a_target() {
        let s: StreamId = "group:123456".parse().expect("stream");
        assert!(s.is_group());
        assert_eq!(s.target(), "123456");
        assert!("private:-42".parse::<StreamId>().is_ok());
        for bad in ["group", "group:", ":1", "Group:1", "group:1 2"] {
            assert!(bad.parse::<StreamId>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_handle_prefix_is_split_from_the_answer() {
        let (h, rest) = Handle::strip_prefix("#A3f9 yes, go on").expect("handle");
        assert_eq!(h.as_str(), "a3f9");
        assert_eq!(rest, "yes, go on");
        let (h, rest) = Handle::strip_prefix("  #beef: blue").expect("handle");
        assert_eq!((h.as_str(), rest), ("beef", "blue"));
        assert!(Handle::strip_prefix("no handle here").is_none());
        assert!(Handle::strip_prefix("# spaced").is_none());
        assert_eq!(Handle::random().as_str().len(), Handle::LEN);
    }

    #[test]
    fn errors_repeat_at_most_a_short_clean_piece_of_the_input() {
        let flood = format!("{}\0\n", "@0".repeat(10_000));
        for message in [
            flood.parse::<TaskRef>().unwrap_err().to_string(),
            flood.parse::<Owner>().unwrap_err().to_string(),
            flood.parse::<StreamId>().unwrap_err().to_string(),
            flood.parse::<Role>().unwrap_err().to_string(),
            flood.parse::<TaskId>().unwrap_err().to_string(),
        ] {
            assert!(message.chars().count() < 200, "{message}");
            assert!(!message.contains('\0'), "{message}");
        }
        assert_eq!(shown("short"), "short");
        assert_eq!(shown("a\0b"), "a b");
        assert_eq!(shown(&"x".repeat(50)).chars().count(), SHOWN_CHARS + 1);
    }

    #[test]
    fn roles_are_ordered_and_parsed() {
        assert!(Role::Guest < Role::User && Role::User < Role::Admin);
        assert_eq!("Admin".parse::<Role>(), Ok(Role::Admin));
        assert!("root".parse::<Role>().is_err());
    }
}
