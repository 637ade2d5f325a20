//! What `check` says about TLS settings, Kafka's included, and when the files are read.

use super::*;

/// A config for `check` with `redis` as the `[redis]` section (and its subtables) and `sink`
/// as sink `r`, plus a trigger on it.
fn check_config(redis: &str, sink: &str) -> String {
    format!("{redis}\n{sink}\n{MINIMAL_TRIGGER}")
}

/// `[redis]` at a `rediss://` URL, plus `tls` lines in `[redis.tls]`.
fn rediss(tls: &str) -> String {
    format!("[redis]\nurl = \"rediss://127.0.0.1:6380/0\"\n[redis.tls]\n{tls}\n")
}

/// `[sinks.r]` at an `amqps://` URL, plus `tls` lines in `[sinks.r.tls]`.
fn amqps(tls: &str) -> String {
    format!(
        "[sinks.r]\ntype = \"amqp\"\nurl = \"amqps://guest:guest@127.0.0.1:5671/%2f\"\n\
         [sinks.r.tls]\n{tls}\n"
    )
}

/// `key = "path"` as a TOML line.
fn file_line(key: &str, path: &Path) -> String {
    format!("{key} = {}\n", quoted(path.to_str().unwrap()))
}

/// The TLS lines of a client: the test CA, the client certificate and `key_file`.
fn client_files(pki: &Pki, key_file: &std::path::Path) -> String {
    file_line("ca_file", &pki.ca())
        + &file_line("cert_file", &pki.client_cert())
        + &file_line("key_file", key_file)
}

/// A copy of the client's private key, `name` in the PKI's folder.
fn key_copy(pki: &Pki, name: &str) -> std::path::PathBuf {
    let copy = pki.dir().join(name);
    std::fs::copy(pki.client_key(), &copy).unwrap();
    copy
}

#[test]
fn check_accepts_tls_files_and_warns_when_verification_is_off() {
    let pki = Pki::new();
    let files = client_files(&pki, &pki.client_key());
    let (code, text) = check(&check_config(&rediss(&files), &amqps(&files)));
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("insecure"), "{text}");

    for (what, config) in [
        (
            "redis",
            check_config(&rediss("insecure = true"), MINIMAL_SINK),
        ),
        ("sink", check_config("", &amqps("insecure = true"))),
    ] {
        let (code, text) = check(&config);
        assert_eq!(code, 0, "{what}: {text}");
        assert!(
            text.lines().any(|l| l.contains("insecure")),
            "{what}: a warning line about insecure:\n{text}"
        );
    }
}

#[test]
fn check_warns_about_a_private_key_others_can_read_and_never_prints_it() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let shared = key_copy(&pki, "shared.key");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    let files = client_files(&pki, &shared);
    let (code, text) = check(&check_config(&rediss(&files), MINIMAL_SINK));
    assert_eq!(code, 0, "{text}");
    let warning = text
        .lines()
        .find(|l| l.contains("redis.tls") && l.contains("readable by group or others"))
        .unwrap_or_else(|| panic!("a warning about the key's mode:\n{text}"));
    assert!(warning.contains("644"), "{warning}");
    let key = std::fs::read_to_string(&shared).unwrap();
    let secret_line = key.lines().nth(1).unwrap();
    assert!(
        !text.contains(secret_line),
        "the key's contents are never printed"
    );
}

#[test]
fn tls_files_are_read_once_when_the_configuration_is_loaded() {
    let pki = Pki::new();
    let key = key_copy(&pki, "read-once.key");
    let files = client_files(&pki, &key);
    let path = pki.dir().join("read-once.toml");
    std::fs::write(&path, check_config(&rediss(&files), MINIMAL_SINK)).unwrap();
    let config = delay_bridge::parts::config::load(&path).unwrap();
    std::fs::remove_file(&key).unwrap();
    // The connection uses the client built at load, not the files, which are gone now.
    delay_bridge::parts::redis::conn::Endpoint::new(&config.redis).expect("the client loaded once");
    // The same settings validated again read the files: the key is missing now.
    let again = delay_bridge::parts::config::Redis::validate(config.redis.settings().clone());
    let e = again.expect_err("the key file is gone");
    assert!(e.to_string().contains("redis.tls.key_file"), "{e}");
}

#[test]
fn check_names_the_tls_key_that_is_wrong() {
    let pki = Pki::new();
    let missing = pki.dir().join("missing.pem");
    let cert_only = file_line("cert_file", &pki.client_cert());
    let no_ca = file_line("ca_file", &missing);
    let mismatched = file_line("cert_file", &pki.client_cert())
        + &file_line("key_file", &pki.server(ServerCert::Loopback).1);
    for (what, config, key) in [
        (
            "redis cert without key",
            check_config(&rediss(&cert_only), MINIMAL_SINK),
            "redis.tls.key_file",
        ),
        (
            "redis ca_file missing",
            check_config(&rediss(&no_ca), MINIMAL_SINK),
            "redis.tls.ca_file",
        ),
        (
            "sink cert without key",
            check_config("", &amqps(&cert_only)),
            "sinks.r.tls.key_file",
        ),
        (
            "sink ca_file missing",
            check_config("", &amqps(&no_ca)),
            "sinks.r.tls.ca_file",
        ),
        (
            "redis key of another certificate",
            check_config(&rediss(&mismatched), MINIMAL_SINK),
            "redis.tls.key_file: ",
        ),
    ] {
        let (code, text) = check(&config);
        assert_eq!(code, 78, "{what}: {text}");
        assert!(text.contains(key), "{what}: {key} missing from:\n{text}");
    }
}

#[test]
fn check_refuses_redis_tls_settings_on_a_plain_url() {
    let pki = Pki::new();
    let redis = format!(
        "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[redis.tls]\n{}",
        file_line("ca_file", &pki.ca())
    );
    let (code, text) = check(&check_config(&redis, MINIMAL_SINK));
    assert_eq!(code, 78, "{text}");
    assert!(
        text.contains("redis.tls") || text.contains("redis.url"),
        "{text}"
    );
    let (code, text) = check(&check_config(
        &redis.replace("redis://", "rediss://"),
        MINIMAL_SINK,
    ));
    assert_eq!(code, 0, "the same settings with rediss://: {text}");
}

#[test]
fn check_refuses_a_kafka_ssl_ca_location_that_does_not_exist() {
    let pki = Pki::new();
    let kafka = |ca: &Path| {
        format!(
            "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9093\"\n\
             [sinks.k.properties]\n\"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = {}\n\
             [[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"k\"\ntopic = \"t\"\n",
            quoted(ca.to_str().unwrap())
        )
    };
    let (code, text) = check(&kafka(&pki.dir().join("missing.pem")));
    assert_eq!(code, 78, "{text}");
    assert!(
        text.contains("sinks.k.properties.ssl.ca.location"),
        "{text}"
    );
    let (code, text) = check(&kafka(&pki.ca()));
    assert_eq!(code, 0, "{text}");
}
