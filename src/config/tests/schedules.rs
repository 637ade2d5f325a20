//! Unit tests of `[[triggers.schedules]]`: defaults, and every bad field named under its key
//! with the others.
#![allow(clippy::result_large_err)]

use super::*;

#[test]
fn a_schedule_takes_its_defaults() {
    Jail::expect_with(|jail| {
        let toml = format!(
            "{MINIMAL}\n[[triggers.schedules]]\nname = \"nightly\"\ncron = \"0 30 2 * * *\"\nbody = \"{{}}\"\n"
        );
        let c = load_in_jail(jail, &toml).unwrap();
        let s = &c.triggers[0].schedules()[0];
        assert_eq!(s.timezone, "UTC");
        assert_eq!(s.misfire, Misfire::Skip);
        assert_eq!(s.misfire_grace, Duration::from_secs(60));
        assert_eq!(s.catch_up_limit, 100);
        Ok(())
    });
}

#[test]
fn every_bad_schedule_field_is_named() {
    Jail::expect_with(|jail| {
        let toml = format!(
            "{MINIMAL}
[[triggers.schedules]]
name = \"a\"
cron = \"61 * * * *\"
timezone = \"Mars/Olympus\"
body = \"x\"
misfire_grace = \"0s\"
catch_up_limit = 0

[[triggers.schedules]]
name = \"a\"
cron = \"@daily\"
body = \"x\"
misfire = \"all\"
"
        );
        let keys = rejected_keys(jail, &toml);
        assert_eq!(
            keys,
            [
                "triggers[0].schedules[0].cron",
                "triggers[0].schedules[0].timezone",
                "triggers[0].schedules[0].misfire_grace",
                "triggers[0].schedules[0].catch_up_limit",
                "triggers[0].schedules[1].name",
            ]
        );
        let unknown = format!(
            "{MINIMAL}\n[[triggers.schedules]]\nname = \"a\"\ncron = \"* * * * *\"\nbody = \"\"\nmisfire = \"later\"\n"
        );
        assert!(rejected_keys(jail, &unknown)
            .iter()
            .all(|k| k.starts_with("triggers[0]")));
        Ok(())
    });
}
