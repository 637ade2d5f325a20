//! Where a key is in the configuration file: its line and column, for problems to point at.

use std::ops::Range;

use toml_edit::{ImDocument, Item, TableLike, Value};

/// One step of a problem's key: a field, or an index in an array (`triggers[2]`).
#[derive(Debug, PartialEq)]
enum Part<'a> {
    Name(&'a str),
    Index(usize),
}

/// `triggers[0].tls.ca_file` as its steps.
fn parts(key: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    for segment in key.split('.').filter(|s| !s.is_empty()) {
        let (name, mut rest) = match segment.find('[') {
            Some(at) => segment.split_at(at),
            None => (segment, ""),
        };
        if !name.is_empty() {
            out.push(Part::Name(name));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let Some(end) = inner.find(']') else { break };
            match inner[..end].parse() {
                Ok(i) => out.push(Part::Index(i)),
                Err(_) => out.push(Part::Name(&inner[..end])),
            }
            rest = &inner[end + 1..];
        }
    }
    out
}

/// Where the walk is: a table (of the file, of an array of tables, inline) or an item.
enum At<'a> {
    Table(&'a dyn TableLike),
    Item(&'a Item),
    Value(&'a Value),
}

/// The 1-based line and column in `text` (a TOML file) of the deepest part of `key` the
/// file has: the key itself, else the table that should hold it. `None` when the file does
/// not parse or has none of it.
pub(crate) fn locate(text: &str, key: &str) -> Option<(usize, usize)> {
    let doc = ImDocument::parse(text).ok()?;
    let mut at = At::Table(doc.as_table());
    let mut span: Option<Range<usize>> = None;
    for part in parts(key) {
        let next = match (&at, part) {
            (At::Table(t), Part::Name(name)) => t.get_key_value(name).map(|(k, item)| {
                span = k.span().or_else(|| item.span()).or(span.clone());
                At::Item(item)
            }),
            (At::Item(item), Part::Name(name)) => match item.as_table_like() {
                Some(t) => t.get_key_value(name).map(|(k, item)| {
                    span = k.span().or_else(|| item.span()).or(span.clone());
                    At::Item(item)
                }),
                // `triggers.NAME`: the entry of an array of tables with that name.
                None => item.as_array_of_tables().and_then(|tables| {
                    let t = tables
                        .iter()
                        .find(|t| t.get("name").and_then(Item::as_str) == Some(name))?;
                    span = t.span().or(span.clone());
                    Some(At::Table(t))
                }),
            },
            (At::Item(item), Part::Index(i)) => {
                if let Some(t) = item.as_array_of_tables().and_then(|a| a.get(i)) {
                    span = t.span().or(span.clone());
                    Some(At::Table(t))
                } else if let Some(v) = item.as_array().and_then(|a| a.get(i)) {
                    span = v.span().or(span.clone());
                    Some(At::Value(v))
                } else {
                    None
                }
            }
            (At::Value(Value::InlineTable(t)), Part::Name(name)) => {
                t.get_key_value(name).map(|(k, item)| {
                    span = k.span().or_else(|| item.span()).or(span.clone());
                    At::Item(item)
                })
            }
            _ => None,
        };
        match next {
            Some(next) => at = next,
            None => break,
        }
    }
    span.map(|s| line_column(text, s.start))
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "[redis]\nurl = \"redis://x\"\n\n[sinks.rabbit]\ntype = \"amqp\"\n\n\
        [[triggers]]\nname = \"a\"\nkey = \"k\"\n\n[[triggers]]\nname = \"b\"\n  lease = 5\n\
        tls = { ca_file = \"/x\" }\nallowed = [\"p\", \"q\"]\n";

    #[test]
    fn keys_are_found_at_their_line_and_column() {
        assert_eq!(locate(FILE, "redis.url"), Some((2, 1)));
        assert_eq!(locate(FILE, "sinks.rabbit.type"), Some((5, 1)));
        assert_eq!(locate(FILE, "triggers[1].lease"), Some((13, 3)));
        assert_eq!(locate(FILE, "triggers.b.lease"), Some((13, 3)));
        assert_eq!(locate(FILE, "triggers[1].tls.ca_file"), Some((14, 9)));
        assert_eq!(locate(FILE, "triggers[1].allowed[1]"), Some((15, 17)));
        // A missing key points at the table that should hold it.
        assert_eq!(locate(FILE, "triggers[0].sink"), Some((7, 1)));
        assert_eq!(locate(FILE, "nothing"), None);
        assert_eq!(locate("not = = toml", "not"), None);
    }

    #[test]
    fn keys_split_into_names_and_indexes() {
        assert_eq!(
            parts("triggers[2].headers.x"),
            [
                Part::Name("triggers"),
                Part::Index(2),
                Part::Name("headers"),
                Part::Name("x")
            ]
        );
        assert_eq!(line_column("ab\ncé d", 7), (2, 4));
    }
}
