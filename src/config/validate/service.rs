//! The daemon's own sections: `[shutdown]`, `[admin]`, `[log]` and `[metrics]`.

use std::time::Duration;

use super::{too_long, Parsed, HOUR};

/// Problems of the daemon's own sections.
pub(super) fn service_problems(config: &Parsed, push: &mut impl FnMut(String, String)) {
    if config.shutdown.timeout.is_zero() {
        push(
            "shutdown.timeout".into(),
            "must be greater than zero".into(),
        );
    }
    if let Some(listen) = config.admin.listen {
        if listen == config.metrics.listen {
            push(
                "admin.listen".into(),
                format!("{listen} is metrics.listen already: the admin API needs its own"),
            );
        }
        match config.admin.token() {
            Err(e) => push("admin.token_file".into(), format!("{e:#}")),
            Ok(Some(t)) if t.chars().count() < 16 => push(
                "admin.token_file".into(),
                format!(
                    "the token is {} characters; use at least 16 (e.g. `openssl rand -hex 24`)",
                    t.chars().count()
                ),
            ),
            Ok(None) if !config.admin.read_only => push(
                "admin.token_file".into(),
                format!(
                    "the admin API changes queues only with a token: set token_file or {}, or read_only = true",
                    super::super::ADMIN_TOKEN_ENV
                ),
            ),
            _ => {}
        }
    }
    for (key, value, max) in [
        ("shutdown.timeout", config.shutdown.timeout, HOUR),
        (
            "metrics.backlog_interval",
            config.metrics.backlog_interval,
            HOUR,
        ),
    ] {
        if let Some(why) = too_long(value, max) {
            push(key.into(), why);
        }
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&config.log.level) {
        push("log.level".into(), format!("not a valid log filter: {e}"));
    }
    if config.metrics.backlog_interval < Duration::from_millis(100) {
        push(
            "metrics.backlog_interval".into(),
            "must be at least 100ms".into(),
        );
    }
}
