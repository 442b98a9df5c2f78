//! How many of the people a question is put to must answer before its task goes on.

/// How many of the people an ask is put to must answer before its task goes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Need {
    /// The first valid answer.
    #[default]
    Any,
    /// Every one of them.
    All,
    /// This many (at most all of them).
    Count(u16),
}

impl std::str::FromStr for Need {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "any" => Ok(Need::Any),
            "all" => Ok(Need::All),
            n => match n.parse::<u16>() {
                Ok(0) | Err(_) => Err(format!(
                    "need: `{text}` is not \"any\", \"all\" or a number of answers from 1"
                )),
                Ok(n) => Ok(Need::Count(n)),
            },
        }
    }
}

impl Need {
    /// How many answers of `people` this needs.
    pub fn of(self, people: usize) -> i16 {
        let people = i16::try_from(people.max(1)).unwrap_or(i16::MAX);
        match self {
            Need::Any => 1,
            Need::All => people,
            Need::Count(n) => i16::try_from(n).unwrap_or(i16::MAX).clamp(1, people),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_reads_any_all_or_a_count_and_is_bounded_by_the_people() {
        assert_eq!("".parse::<Need>(), Ok(Need::Any));
        assert_eq!(" ALL ".parse::<Need>(), Ok(Need::All));
        assert_eq!("2".parse::<Need>(), Ok(Need::Count(2)));
        assert!("0".parse::<Need>().is_err());
        assert!("most".parse::<Need>().unwrap_err().contains("`most`"));
        assert_eq!(Need::Any.of(3), 1);
        assert_eq!(Need::All.of(3), 3);
        assert_eq!(Need::Count(5).of(3), 3);
        assert_eq!(Need::Count(2).of(3), 2);
    }
}
