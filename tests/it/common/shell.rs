//! What a command run to completion left: success, or its output to say why not.

use std::process::Output;

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
