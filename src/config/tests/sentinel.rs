//! Sentinel mode: the sentinels, the master's name, and every problem of the section at once.
#![allow(clippy::result_large_err)]

use figment::Jail;

use super::{assert_redis_rejected, assert_rejected_under, load_in_jail, MINIMAL};
use crate::config::RedisMode;

#[test]
fn sentinel_mode_takes_sentinels_and_a_master_name() {
    Jail::expect_with(|jail| {
        let ok = MINIMAL.to_string()
            + "\n[redis]\nmode = \"sentinel\"\nmaster_name = \"mymaster\"\n\
               sentinels = [\"redis://10.0.0.1:26379\", \"redis://10.0.0.2:26379\"]\n\
               sentinel_username = \"watcher\"\n";
        let c = load_in_jail(jail, &ok).unwrap();
        assert_eq!(c.redis.settings().mode, RedisMode::Sentinel);
        assert_eq!(c.redis.settings().sentinels.len(), 2);
        assert_eq!(c.redis.settings().master_name.as_deref(), Some("mymaster"));
        Ok(())
    });
}

#[test]
fn every_problem_of_a_sentinel_section_is_reported() {
    Jail::expect_with(|jail| {
        let bad = MINIMAL.to_string()
            + "\n[redis]\nmode = \"sentinel\"\nurl = \"redis://10.0.0.9:6379/0\"\n\
               sentinels = [\"redis://10.0.0.1:26379/2\", \"rediss://10.0.0.2:26379\", \
               \"http://x:1\", \"redis://u:p@10.0.0.3:26379\", \"redis://10.0.0.4:26379\"]\n\
               [redis.tls]\ninsecure = true\n";
        assert_rejected_under(
            jail,
            &bad,
            &[
                "redis.master_name",
                "redis.url",
                "redis.sentinels[0]",
                "redis.sentinels[2]",
                "redis.sentinels[3]",
                "redis.sentinels",
                "redis.tls.insecure",
            ],
        );

        let empty = "mode = \"sentinel\"\nmaster_name = \"m\"\n";
        assert_redis_rejected(jail, empty, &["redis.sentinels"]);
        let stray = "sentinels = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"m\"\n";
        assert_redis_rejected(jail, stray, &["redis.sentinels", "redis.master_name"]);
        Ok(())
    });
}
