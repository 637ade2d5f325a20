//! Credentials: Redis ACL and RabbitMQ users by URL, `*_file` and environment; secrets never printed.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::servers::RedisServer;
use common::*;

/// A password with every character that needs care in a URL.
fn hostile_password() -> String {
    format!("p@ss:w/rd#%?&+ {}", unique("x"))
}

/// `base` (a test server's URL) with user `name` and `password` (percent-encoded).
fn user_url(base: &str, name: &str, password: Option<&str>) -> String {
    let mut u = url::Url::parse(base).unwrap();
    u.set_username(name).unwrap();
    u.set_password(password).unwrap();
    u.to_string()
}

/// A Redis ACL user on the shared Redis, deleted on drop.
struct RedisUser {
    name: String,
    password: String,
}

impl RedisUser {
    async fn create() -> Self {
        let user = Self {
            name: unique("bridge-user"),
            password: hostile_password(),
        };
        let mut r = redis().await;
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user.name)
            .arg("on")
            .arg(format!(">{}", user.password))
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .query_async(&mut r)
            .await
            .unwrap();
        user
    }

    /// The test Redis URL with this user and `password`.
    fn url(&self, password: Option<&str>) -> String {
        user_url(&redis_url(), &self.name, password)
    }
}

impl Drop for RedisUser {
    fn drop(&mut self) {
        if let Ok(mut c) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) {
            let _: redis::RedisResult<i64> = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&self.name)
                .query(&mut c);
        }
    }
}

/// A RabbitMQ user with full rights on vhost `/`, deleted on drop.
struct RabbitUser {
    name: String,
    password: String,
}

fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl must be installed next to the test RabbitMQ");
    assert!(
        out.status.success(),
        "rabbitmqctl {}: {}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
}

impl RabbitUser {
    fn create() -> Self {
        let user = Self {
            name: unique("bridge-user"),
            password: hostile_password(),
        };
        rabbitmqctl(&["add_user", &user.name, &user.password]);
        rabbitmqctl(&["set_permissions", "-p", "/", &user.name, ".*", ".*", ".*"]);
        user
    }

    /// The test RabbitMQ URL with this user and `password`.
    fn url(&self, password: Option<&str>) -> String {
        user_url(&amqp_url(), &self.name, password)
    }
}

impl Drop for RabbitUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["delete_user", &self.name])
            .output();
    }
}

/// Every form a secret could leak in: raw and percent-encoded.
fn forms(secret: &str) -> Vec<String> {
    let mut u = url::Url::parse("redis://h").unwrap();
    u.set_password(Some(secret)).unwrap();
    vec![secret.to_string(), u.password().unwrap().to_string()]
}

fn assert_hidden(what: &str, text: &str, secret: &str) {
    for form in forms(secret) {
        assert!(
            !text.contains(&form),
            "{what} shows the secret {form:?}:\n{text}"
        );
    }
}

/// How a credential reaches the bridge.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    Url,
    File,
    Env,
}

/// Where a server's credentials go in the config.
struct Credentials {
    /// Its name in messages.
    what: &'static str,
    /// Its URL for tests.
    url: fn() -> String,
    /// The section holding its `url` and `password_file`.
    section: &'static str,
    /// The variable that overrides that `url`.
    env_var: &'static str,
    /// A `url` for the file that cannot work: with `Via::Env`, the variable must win.
    unusable_url: &'static str,
    /// The run whose log is JSON (a secret must leak in neither format).
    json_log: Via,
}

const REDIS: Credentials = Credentials {
    what: "redis",
    url: redis_url,
    section: "redis",
    env_var: "DELAY_BRIDGE_REDIS__URL",
    unusable_url: "redis://127.0.0.1:1/0",
    json_log: Via::File,
};

const AMQP: Credentials = Credentials {
    what: "amqp",
    url: amqp_url,
    section: "sinks.rabbit",
    env_var: "DELAY_BRIDGE_SINKS__RABBIT__URL",
    unusable_url: "amqp://nobody@127.0.0.1:1/%2f",
    json_log: Via::Url,
};

/// [`forward_once`] with user `name`'s credentials given each way: in the URL, as the URL
/// without the password plus a password file (the password, then `line_end`), and as the URL
/// in the environment; `capture` receives the three messages.
async fn forward_each_way(
    c: &Credentials,
    (name, password): (&str, &str),
    line_end: &str,
    capture: &AmqpCapture,
) {
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join(format!("{}-password", c.what));
    std::fs::write(&password_file, format!("{password}{line_end}")).unwrap();
    let url = |password| user_url(&(c.url)(), name, password);
    let full_url = url(Some(password));
    for via in [Via::Url, Via::File, Via::Env] {
        let port = free_port();
        let key = format!("{}:{{sec}}", unique("delay"));
        let settings = ConfigToml::base(port);
        let settings = match via {
            Via::Url => settings.set_str(c.section, "url", &full_url),
            Via::File => settings.set_str(c.section, "url", &url(None)).set_str(
                c.section,
                "password_file",
                &password_file.display().to_string(),
            ),
            Via::Env => settings.set_str(c.section, "url", c.unusable_url),
        };
        let settings = if via == c.json_log {
            settings.set_str("log", "format", "json")
        } else {
            settings
        };
        let env: &[(&str, &str)] = match via {
            Via::Env => &[(c.env_var, &full_url)],
            _ => &[],
        };
        let config = settings.to_string() + &amqp_trigger("sec", &key, capture, "workers = 1");
        let what = format!("{} {via:?}", c.what);
        forward_once(&config, env, port, password, &what).await;
    }
    assert_eq!(capture.count(), 3, "one message forwarded each way");
}

/// Starts a bridge, forwards one message through it and checks that `secret` appears in
/// neither `check`, the log nor `/metrics`.
async fn forward_once(config: &str, env: &[(&str, &str)], port: u16, secret: &str, what: &str) {
    let (code, text) = check_with_env(config, env);
    assert_eq!(code, 0, "{what}: check failed:\n{text}");
    assert_hidden(&format!("{what}: check"), &text, secret);

    let mut r = redis().await;
    let key = config
        .lines()
        .find_map(|l| l.strip_prefix("key = \""))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    let mut bridge = Bridge::start_with_env(config, port, env);
    assert!(
        bridge.wait_ready(Duration::from_secs(20)).await,
        "{what}: not ready\n{}",
        bridge.log()
    );
    zadd(&mut r, &key, 0, format!("through {what}")).await;
    let (forwarded, metrics) = bridge
        .wait_scrape(Duration::from_secs(15), |b| {
            metric_value(b, "delay_bridge_messages_forwarded_total", &[]) >= 1.0
        })
        .await;
    assert!(forwarded, "{what}: not forwarded\n{}", bridge.log());
    assert_hidden(&format!("{what}: /metrics"), &metrics, secret);
    bridge.terminate(Duration::from_secs(15)).await;
    assert_hidden(&format!("{what}: log"), &bridge.log(), secret);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acl_user_by_url_file_and_env_and_a_wrong_password_fails_clearly() {
    let user = RedisUser::create().await;
    let capture = AmqpCapture::start("sec.redis").await;
    let credentials = (user.name.as_str(), user.password.as_str());
    // Editors add a trailing newline; it is not part of the password.
    forward_each_way(&REDIS, credentials, "\n", &capture).await;

    // A wrong password: refuses to start with a clear message, no panic, the password not echoed.
    let wrong = hostile_password();
    let (config, _) = config_with_url("redis", &user.url(Some(&wrong)), &capture);
    refuses(&config, "rejected the credentials", &wrong).await;
    drop(user);
}

/// Starts a bridge that must exit non-zero, saying `why`, without showing `secret`.
async fn refuses(config: &str, why: &str, secret: &str) {
    let port = config
        .lines()
        .find_map(|l| l.strip_prefix("listen = \"127.0.0.1:"))
        .and_then(|p| p.trim_end_matches('"').parse().ok())
        .unwrap();
    let mut bridge = Bridge::start(config, port);
    let code = bridge.wait_exit(Duration::from_secs(30)).await;
    let log = bridge.log();
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}:\n{log}");
    assert!(log.contains(why), "does not say {why:?}:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert_hidden("log", &log, secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_requirepass_needs_the_password_and_takes_it_from_a_file() {
    let password = hostile_password();
    let server = RedisServer::start(&["--requirepass", &password]).await;
    let capture = AmqpCapture::start("sec.requirepass").await;
    let port = free_port();
    let key = format!("{}:{{pw}}", unique("delay"));
    let trigger = amqp_trigger("pw", &key, &capture, "workers = 1");

    // No password at all: the connection opens, commands would fail; the bridge says so at once.
    let settings = ConfigToml::base(port).set_str("redis", "url", &server.url());
    refuses(
        &(settings.to_string() + &trigger),
        "requires credentials",
        &password,
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("pw");
    std::fs::write(&pw_file, format!("{password}\n")).unwrap();
    let settings = settings.set_str("redis", "password_file", &pw_file.display().to_string());
    let mut bridge = Bridge::start(&(settings.to_string() + &trigger), port)
        .ready(Duration::from_secs(20))
        .await;
    let mut u = url::Url::parse(&server.url()).unwrap();
    u.set_password(Some(&password)).unwrap();
    let mut r = connect(&redis::Client::open(u.as_str()).unwrap())
        .await
        .unwrap();
    zadd(&mut r, &key, 0, "behind a password").await;
    assert!(
        wait_until(Duration::from_secs(15), || capture.count() == 1).await,
        "{}",
        bridge.log()
    );
    bridge.terminate(Duration::from_secs(15)).await;
    assert_hidden("log", &bridge.log(), &password);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_user_by_url_file_and_env_and_a_wrong_password_fails_clearly() {
    let user = RabbitUser::create();
    let capture = AmqpCapture::start("sec.amqp").await;
    let credentials = (user.name.as_str(), user.password.as_str());
    forward_each_way(&AMQP, credentials, "\r\n", &capture).await;

    let wrong = hostile_password();
    let (config, port) = config_with_url("sinks.rabbit", &user.url(Some(&wrong)), &capture);
    let mut bridge = Bridge::start(&config, port);
    let said = wait_until(Duration::from_secs(15), || {
        let log = bridge.log().to_lowercase();
        log.contains("access_refused") || log.contains("auth") || log.contains("login")
    })
    .await;
    let log = bridge.log();
    assert!(said, "no authentication error logged:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert_hidden("wrong-password log", &log, &wrong);
    let (code, _) = bridge
        .get("/readyz")
        .await
        .expect("serving while the sink is down");
    assert_ne!(code, 200, "ready without RabbitMQ");
    let metrics = bridge.scrape().await;
    assert_eq!(
        metric_value(&metrics, "delay_bridge_sink_up", &[("sink", "rabbit")]),
        0.0
    );
    assert_hidden("wrong-password /metrics", &metrics, &wrong);
    bridge.terminate(Duration::from_secs(15)).await;
    assert_hidden("wrong-password log", &bridge.log(), &wrong);
}

#[test]
fn kafka_sasl_password_is_not_shown_by_check() {
    let secret = hostile_password();
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("sasl");
    std::fs::write(&pw_file, &secret).unwrap();
    let config = format!(
        r#"
[sinks.k]
type = "kafka"
brokers = "127.0.0.1:9093"
sasl_password_file = "{}"
[sinks.k.properties]
"security.protocol" = "SASL_SSL"
"sasl.mechanisms" = "SCRAM-SHA-512"
"sasl.username" = "bridge"
"sasl.password" = "{secret}"
"ssl.key.password" = "{secret}"
"ssl.key.pem" = "{secret}"
"sasl.oauthbearer.client.secret" = "{secret}"

[[triggers]]
name = "t"
key = "k"
sink = "k"
topic = "x"
"#,
        pw_file.display()
    );
    let (code, text) = check(&config);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("sasl.username=bridge"), "{text}");
    assert_hidden("check", &text, &secret);
}

/// A bridge config whose `section` connects to `url`, with a trigger on a fresh key to
/// `capture`; and the bridge's metrics port.
fn config_with_url(section: &str, url: &str, capture: &AmqpCapture) -> (String, u16) {
    let port = free_port();
    let key = unique("delay");
    let config = ConfigToml::base(port)
        .set_str(section, "url", url)
        .to_string()
        + &amqp_trigger("sec", &key, capture, "");
    (config, port)
}
