//! Values cut to a bound for what people read (logs, replies, dead letters' details).

/// `text` cut to `chars` characters, marked with `...` when cut.
pub(crate) fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_characters_and_marks_the_cut() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcd", 3), "abc...");
        assert_eq!(shorten("ééé", 2), "éé...");
    }
}
