//! `allowed_topics` patterns: which topics a Kafka record may choose for itself (an ingress record's `x-delay-topic`, an envelope's `topic`).

use regex::{RegexSet, RegexSetBuilder};
use serde::{Serialize, Serializer};

/// Most bytes of compiled program one set of patterns may take: a pattern that would need
/// more is refused at load instead of slowing every match.
const SIZE_LIMIT: usize = 1 << 20;

/// The patterns of `allowed_topics`, each a regular expression matched against the whole
/// topic name (as Kafka's `topics.regex`), compiled once at load.
#[derive(Debug, Clone)]
pub struct TopicPatterns {
    patterns: Vec<String>,
    set: RegexSet,
}

impl TopicPatterns {
    /// Compiles `patterns`, or says what is wrong with each that cannot be used.
    pub fn new(patterns: &[String]) -> Result<Self, Vec<String>> {
        if patterns.is_empty() {
            return Err(vec![
                "an empty list allows nothing: remove it so that records cannot choose their topic"
                    .into(),
            ]);
        }
        let mut problems = Vec::new();
        for p in patterns {
            // Alone first: a pattern that is valid by itself closes every group it opens,
            // so the anchors around it cannot be escaped (`x)|(.*`).
            let alone = compile(std::slice::from_ref(p), false);
            if let Err(why) = alone.and_then(|_| compile(std::slice::from_ref(p), true)) {
                problems.push(format!("`{p}`: {why}"));
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let set = compile(patterns, true).map_err(|why| vec![why])?;
        Ok(Self {
            patterns: patterns.to_vec(),
            set,
        })
    }

    /// Whether a record may be produced to `topic`: one pattern matches the whole name.
    pub fn allows(&self, topic: &str) -> bool {
        self.set.is_match(topic)
    }

    /// The patterns as written.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

/// Compiles the patterns as one set, each anchored on the whole name if `anchored`; the
/// error is the regex crate's last line (its first lines draw the pattern with a caret
/// under the fault).
fn compile(patterns: &[String], anchored: bool) -> Result<RegexSet, String> {
    let wrap = |p: &String| {
        if anchored {
            format!("^(?:{p})$")
        } else {
            p.clone()
        }
    };
    RegexSetBuilder::new(patterns.iter().map(wrap))
        .size_limit(SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => {
                "too complex: its compiled form would be over 1 MiB".to_string()
            }
            other => {
                let text = other.to_string();
                let last = text.lines().rev().find(|l| !l.trim().is_empty());
                let why = last.unwrap_or(&text).trim();
                format!(
                    "not a regular expression: {}",
                    why.trim_start_matches("error: ")
                )
            }
        })
}

impl PartialEq for TopicPatterns {
    fn eq(&self, other: &Self) -> bool {
        self.patterns == other.patterns
    }
}

impl Eq for TopicPatterns {}

impl Serialize for TopicPatterns {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.patterns.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(list: &[&str]) -> Result<TopicPatterns, Vec<String>> {
        TopicPatterns::new(&list.iter().map(|p| p.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn a_pattern_matches_the_whole_name() {
        let p = patterns(&[r"orders\..*", "billing"]).unwrap();
        assert!(p.allows("orders.eu"));
        assert!(p.allows("orders."));
        assert!(p.allows("billing"));
        assert!(!p.allows("orders"), "the dot is required");
        assert!(!p.allows("old.orders.eu"), "anchored at the start");
        assert!(!p.allows("billing.eu"), "anchored at the end");
        assert!(!p.allows("xbilling"));
        // Alternation stays inside the anchors.
        let p = patterns(&["a|b"]).unwrap();
        assert!(p.allows("a") && p.allows("b"));
        assert!(!p.allows("ab") && !p.allows("xa"));
    }

    #[test]
    fn bad_patterns_are_each_named() {
        let e = patterns(&["ok", "orders(", "[z-a]"]).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].starts_with("`orders(`: not a regular expression"),
            "{e:?}"
        );
        assert!(!e[0].contains('\n'), "one line: {e:?}");
        assert!(e[1].starts_with("`[z-a]`"), "{e:?}");
        assert!(patterns(&[]).unwrap_err()[0].contains("empty list"));
        let escape = patterns(&["x)|(.*"]).unwrap_err();
        assert!(escape[0].contains("not a regular expression"), "{escape:?}");
        let comment = patterns(&["(?x)a#"]).unwrap_err();
        assert_eq!(comment.len(), 1, "a comment cannot swallow the anchor");
        let huge = patterns(&[r"\w{1000}\w{1000}"]).unwrap_err();
        assert!(huge[0].contains("too complex"), "{huge:?}");
    }

    #[test]
    fn patterns_compare_and_serialize_as_written() {
        let a = patterns(&["x.*"]).unwrap();
        assert_eq!(a, patterns(&["x.*"]).unwrap());
        assert_ne!(a, patterns(&["y.*"]).unwrap());
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"["x.*"]"#);
    }
}
