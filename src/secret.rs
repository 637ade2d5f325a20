//! Secrets: reading `*_file` keys and redacting credentials before anything is printed.

use anyhow::Context;

/// Reads a secret from a file, without the trailing newline editors add.
pub(crate) fn read_file(path: &str) -> anyhow::Result<String> {
    let raw =
        std::fs::read_to_string(path).with_context(|| format!("reading secret file {path}"))?;
    Ok(raw.trim_end_matches(['\n', '\r']).to_string())
}

/// The URL with its password replaced by `***`, for logs and `check` output.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparsable url>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://:pw@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://host:6379/0"), "redis://host:6379/0");
        assert!(!redact_url("not a url with secret").contains("secret"));
    }
}
