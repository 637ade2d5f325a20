//! Loading the layered configuration and collecting every problem at once.

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::value::Value;
use figment::Figment;
use serde::de::DeserializeOwned;

use super::problem::{ConfigError, Problem};
use super::validate::{validate, Parsed};
use super::{Config, RedisConfig, SinkConfig, TriggerConfig};

/// Environment variables with this prefix override the file; `__` separates levels.
pub(super) const ENV_PREFIX: &str = "DELAY_BRIDGE_";

/// `DELAY_BRIDGE_<SECTION>__<KEY>` variables. Every setting lives in a section, so a name
/// without `__` (`DELAY_BRIDGE_CONFIG`, where the file is searched) is not an override.
pub(crate) fn env_overrides() -> Env {
    Env::prefixed(ENV_PREFIX)
        .filter(|key| key.as_str().contains("__"))
        .split("__")
}

/// Loads `path`, applies `DELAY_BRIDGE_...` environment overrides and validates the result.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let figment = Figment::new()
        .merge(Toml::file_exact(path))
        .merge(env_overrides());
    load_from(figment, path)
}

/// Like [`load`], from an already layered figment (tests use this with `figment::Jail`).
pub fn load_from(figment: Figment, path: &Path) -> Result<Config, ConfigError> {
    let mut loader = Loader {
        figment,
        file: path.to_path_buf(),
        problems: Vec::new(),
    };
    let validated = validate(loader.extract());
    // A field already refused for its type took its default for validation: what
    // validation says of that default is not the operator's problem.
    let refused: Vec<String> = loader.problems.iter().map(|p| p.key.clone()).collect();
    for (key, message) in validated.problems {
        if !refused.contains(&key) {
            loader.push(&key, message);
        }
    }
    if validated.config.is_none() && loader.problems.is_empty() {
        // Every section that is not validated says why: this is not expected.
        loader.push("", "the configuration could not be validated".into());
    }
    match validated.config {
        Some(config) if loader.problems.is_empty() => Ok(config),
        _ => {
            let mut problems = loader.problems;
            locate_all(&mut problems, path);
            Err(ConfigError { problems })
        }
    }
}

/// Gives each problem from the file `path` the line and column of its key.
fn locate_all(problems: &mut [Problem], path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let file = path.display().to_string();
    for p in problems.iter_mut().filter(|p| p.source == file) {
        p.at = super::location::locate(&text, &p.key);
    }
}

struct Loader {
    figment: Figment,
    file: PathBuf,
    problems: Vec<Problem>,
}

const SECTIONS: [&str; 7] = [
    "redis", "metrics", "admin", "log", "shutdown", "sinks", "triggers",
];

impl Loader {
    /// Extracts section by section so that a bad value in one place does not hide the others;
    /// a broken section is replaced by its defaults and remembered, so validation can go on.
    fn extract(&mut self) -> Parsed {
        let mut parsed = Parsed::default();
        let root = match self.figment.extract::<Value>() {
            Ok(root) => root,
            Err(e) => {
                // The file does not parse: that is the one problem worth reporting.
                self.push_figment("", e);
                parsed.unparsable = true;
                return parsed;
            }
        };
        if let Some(dict) = root.as_dict() {
            for key in dict.keys() {
                if !SECTIONS.contains(&key.as_str()) {
                    self.push(
                        key,
                        format!(
                            "unknown section `{key}`, expected one of {}",
                            SECTIONS.join(", ")
                        ),
                    );
                }
            }
        }
        match self.section::<RedisConfig>("redis") {
            Some(v) => parsed.redis = v,
            None => parsed.broken_redis = true,
        }
        parsed.metrics = self.section("metrics").unwrap_or_default();
        parsed.admin = self.section("admin").unwrap_or_default();
        parsed.log = self.section("log").unwrap_or_default();
        parsed.shutdown = self.section("shutdown").unwrap_or_default();

        if let Some(value) = root.find_ref("sinks") {
            match value.as_dict() {
                Some(dict) => {
                    for (name, value) in dict {
                        match self.sink(name, value) {
                            Some(sink) => {
                                parsed.sinks.insert(name.clone(), sink);
                            }
                            None => parsed.broken_sinks.push(name.clone()),
                        }
                    }
                }
                None => self.push("sinks", "expected a table of sinks ([sinks.NAME])".into()),
            }
        }

        if let Some(value) = root.find_ref("triggers") {
            match value {
                Value::Array(_, items) => {
                    for (i, item) in items.iter().enumerate() {
                        let mut item = item.clone();
                        super::ingress::imply_storage(&mut item);
                        if let Some(t) =
                            self.lenient::<TriggerConfig>(&format!("triggers[{i}]"), &item)
                        {
                            parsed.triggers.push(t);
                            parsed.trigger_index.push(i);
                        }
                    }
                    if items.is_empty() {
                        parsed.trigger_index.clear();
                    }
                }
                _ => self.push(
                    "triggers",
                    "expected an array of tables ([[triggers]])".into(),
                ),
            }
        }
        parsed.had_triggers = root
            .find_ref("triggers")
            .is_some_and(|v| matches!(v, Value::Array(_, items) if !items.is_empty()));
        parsed
    }

    fn section<T: DeserializeOwned + Default>(&mut self, name: &str) -> Option<T> {
        match self.figment.find_value(name) {
            Ok(value) => self.value(name, &value),
            Err(_) => Some(T::default()),
        }
    }

    /// A sink, deserialized by hand on its `type` so that errors name the field
    /// (`sinks.NAME.url`), which serde's internally tagged enums lose.
    fn sink(&mut self, name: &str, value: &Value) -> Option<SinkConfig> {
        let prefix = format!("sinks.{name}");
        let Some(dict) = value.as_dict() else {
            self.push(&prefix, "expected a table".into());
            return None;
        };
        let mut rest = dict.clone();
        let kind = rest.remove("type");
        let rest = Value::from(rest);
        match kind.as_ref().and_then(Value::as_str) {
            Some("amqp") => self.value(&prefix, &rest).map(SinkConfig::Amqp),
            Some("kafka") => self.value(&prefix, &rest).map(SinkConfig::Kafka),
            Some("http") => self.value(&prefix, &rest).map(SinkConfig::Http),
            Some(other) => {
                self.push(
                    &format!("{prefix}.type"),
                    format!("unknown sink type `{other}`, expected `amqp`, `kafka` or `http`"),
                );
                None
            }
            None => {
                let what = if kind.is_some() {
                    "must be a string"
                } else {
                    "missing"
                };
                self.push(
                    &format!("{prefix}.type"),
                    format!("{what}: `amqp`, `kafka` or `http`"),
                );
                None
            }
        }
    }

    /// Like [`Loader::value`], but the table is kept when it deserializes once its bad
    /// fields are taken out (they take their defaults): validation then reports the table's
    /// other problems too. The configuration is refused all the same, for the bad fields.
    fn lenient<T: DeserializeOwned>(&mut self, prefix: &str, value: &Value) -> Option<T> {
        self.deserialize(prefix, value, true)
    }

    /// Deserializes one table, reporting every bad field rather than the first: a field
    /// that fails is reported, taken out, and the rest deserialized again. A missing field
    /// that was taken out for being wrong is not reported twice.
    fn value<T: DeserializeOwned>(&mut self, prefix: &str, value: &Value) -> Option<T> {
        self.deserialize(prefix, value, false)
    }

    fn deserialize<T: DeserializeOwned>(
        &mut self,
        prefix: &str,
        value: &Value,
        lenient: bool,
    ) -> Option<T> {
        let mut value = value.clone();
        let mut removed: Vec<String> = Vec::new();
        loop {
            let e = match value.deserialize::<T>() {
                Ok(v) if removed.is_empty() || lenient => return Some(v),
                // Every problem is reported; the table itself is not usable.
                Ok(_) => return None,
                Err(e) => e,
            };
            let mut next = None;
            for err in e {
                let field = match &err.kind {
                    figment::error::Kind::UnknownField(f, _) => Some(f.clone()),
                    _ => err.path.first().cloned(),
                };
                if let figment::error::Kind::MissingField(f) = &err.kind {
                    if err.path.is_empty() && removed.iter().any(|r| r == f) {
                        continue;
                    }
                }
                let mut key = prefix.to_string();
                for part in &err.path {
                    push_part(&mut key, part);
                }
                let source = self.source_of(prefix);
                self.problems.push(Problem {
                    key: field_key(&key, &err.kind),
                    message: describe(&err.kind),
                    source,
                    at: None,
                });
                next = next.or(field);
            }
            match (&mut value, next) {
                (Value::Dict(_, dict), Some(field)) if dict.contains_key(&field) => {
                    dict.remove(&field);
                    removed.push(field);
                }
                _ => return None,
            }
        }
    }

    fn push_figment(&mut self, prefix: &str, e: figment::Error) {
        for err in e {
            // figment reports the path with the extracted prefix in it, not always in order.
            let own: Vec<&str> = prefix.split('.').collect();
            let mut key = prefix.to_string();
            for part in err.path.iter().filter(|p| !own.contains(&p.as_str())) {
                push_part(&mut key, part);
            }
            let source = match &err.metadata {
                Some(md) => describe_source(md, &self.file),
                None => self.source_of(&key),
            };
            self.problems.push(Problem {
                key: field_key(&key, &err.kind),
                message: err.kind.to_string(),
                source,
                at: None,
            });
        }
    }

    fn push(&mut self, key: &str, message: String) {
        let source = self.source_of(key);
        self.problems.push(Problem {
            key: key.to_string(),
            message,
            source,
            at: None,
        });
    }

    /// The file or environment variable a key came from, falling back to the config file.
    fn source_of(&self, key: &str) -> String {
        let top = key.split(['.', '[']).next().unwrap_or(key);
        let lookup = if key.contains('[') { top } else { key };
        match self.figment.find_metadata(lookup) {
            Some(md) => describe_source(md, &self.file),
            None => self.file.display().to_string(),
        }
    }
}

/// What a problem says: serde's words, but an unknown field names the nearest valid one.
fn describe(kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    match kind {
        Kind::UnknownField(field, expected) => {
            let nearest = expected
                .iter()
                .map(|e| (strsim::damerau_levenshtein(field, e), *e))
                .filter(|(d, e)| *d <= 2.max(e.len() / 4))
                .min();
            match nearest {
                Some((_, e)) => format!("unknown field `{field}`: did you mean `{e}`?"),
                None => format!(
                    "unknown field `{field}`, expected one of: {}",
                    expected.join(", ")
                ),
            }
        }
        other => other.to_string(),
    }
}

/// Appends one path segment: `.field`, or `[i]` for an array index.
fn push_part(key: &mut String, part: &str) {
    if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
        key.push_str(&format!("[{part}]"));
    } else {
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(part);
    }
}

/// Unknown and missing fields name the field itself, not only its parent.
fn field_key(key: &str, kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    let field = match kind {
        Kind::UnknownField(field, _) | Kind::MissingField(std::borrow::Cow::Owned(field)) => {
            Some(field.as_str())
        }
        Kind::MissingField(std::borrow::Cow::Borrowed(field)) => Some(*field),
        _ => None,
    };
    match field {
        Some(field) if !key.ends_with(field) => {
            if key.is_empty() {
                field.to_string()
            } else {
                format!("{key}.{field}")
            }
        }
        _ => key.to_string(),
    }
}

fn describe_source(md: &figment::Metadata, file: &Path) -> String {
    match &md.source {
        Some(figment::Source::File(p)) => p.display().to_string(),
        Some(other) => other.to_string(),
        None if md.name.contains("environment") => format!("{ENV_PREFIX}* environment variables"),
        None => file.display().to_string(),
    }
}
