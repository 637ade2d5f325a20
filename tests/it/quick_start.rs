//! The quick start sets itself up: `scripts/demo.sh` and `scripts/test.sh` install what is
//! missing through one script, `scripts/setup.sh`, and start the services the same way.

use crate::common::{assert_success, run_in_repo};

use std::path::{Path, PathBuf};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The quick start and the test suite install what is missing through one script, which
/// on this machine (everything installed) has nothing to do.
#[test]
fn the_quick_start_and_the_tests_set_up_through_one_script() {
    for script in ["scripts/demo.sh", "scripts/test.sh"] {
        let text = std::fs::read_to_string(repo(script)).unwrap();
        assert!(
            text.contains("scripts/setup.sh "),
            "{script} does not use setup.sh"
        );
        assert!(!text.contains("apt-get"), "{script} installs by itself");
        assert!(text.contains("scripts/services.sh start"), "{script}");
    }
    let demo = std::fs::read_to_string(repo("scripts/demo.sh")).unwrap();
    assert!(
        !demo.contains("redis-cli") && !demo.contains("curl"),
        "only the bridge's own tools"
    );
    let out = run_in_repo("bash", &["scripts/setup.sh", "demo"]);
    assert_success(&out, "scripts/setup.sh demo:\n");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("installing"),
        "nothing to install here"
    );
    let out = run_in_repo("bash", &["scripts/setup.sh", "nonsense"]);
    assert_eq!(out.status.code(), Some(2));
}
