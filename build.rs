//! Build script: records the git revision as `DELAY_BRIDGE_REVISION` for `--version` and
//! `delay_bridge_build_info`.

use std::path::PathBuf;
use std::process::Command;

/// Output of `git ARGS` in the crate's directory, trimmed; `None` without git or a repository.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// Asks cargo to rebuild when the git file `name` (`HEAD`, a ref) changes.
fn watch(name: &str) {
    if let Some(path) = git(&["rev-parse", "--git-path", name]) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DELAY_BRIDGE_REVISION");
    // A build outside a git checkout (a source tarball, a container build without .git)
    // takes the revision from the environment.
    let revision = match git(&["rev-parse", "--short", "HEAD"]) {
        Some(revision) => {
            watch("HEAD");
            if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch(&reference);
            }
            watch("packed-refs");
            revision
        }
        None => std::env::var("DELAY_BRIDGE_REVISION")
            .ok()
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=DELAY_BRIDGE_REVISION={revision}");
}
