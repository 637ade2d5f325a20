//! Commands run to completion from the repository, and what they left: success, or their
//! output to say why not.

use std::process::{Command, Output};

/// Runs `program ARGS` from the repository's root to completion (`program` must be
/// installed).
pub fn run_in_repo(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed: {e}"))
}

/// Panics with `what` followed by the command's stdout and stderr unless it succeeded.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The command's stdout if it succeeded, else its stdout and stderr.
pub fn stdout_if_success(out: &Output) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}
