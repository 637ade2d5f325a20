//! The binary's one-shot subcommands (`check`, `stats`, `enqueue`, `dead-letter`).

use std::path::Path;
use std::process::Command;

use super::binary;

/// What one run of the binary printed.
#[derive(Debug)]
pub struct Output {
    /// Exit code (-1 if killed by a signal).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// stdout and stderr together.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `delay-bridge ARGS --config PATH` with `env` added (and `RUST_LOG` removed); asserts
/// that it did not panic.
pub fn run_cli(args: &[&str], config: &Path, env: &[(&str, &str)]) -> Output {
    let out = Command::new(binary())
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    finished(args, &out)
}

/// Writes `config` to a temp file and runs [`run_cli`] on it; the file's path reads `FILE` in
/// what it printed.
pub fn cli(args: &[&str], config: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let mut out = run_cli(args, &path, env);
    let path = path.to_str().unwrap();
    out.stdout = out.stdout.replace(path, "FILE");
    out.stderr = out.stderr.replace(path, "FILE");
    out
}

/// `delay-bridge check` on `config`: (exit code, stdout and stderr).
pub fn check(config: &str) -> (i32, String) {
    check_with_env(config, &[])
}

/// `delay-bridge check` on `config` with `env`: (exit code, stdout and stderr).
pub fn check_with_env(config: &str, env: &[(&str, &str)]) -> (i32, String) {
    let out = cli(&["check"], config, env);
    (out.code, out.text())
}

/// Like [`cli`], with `stdin` written to the command's standard input.
pub fn cli_stdin(args: &[&str], config: &str, stdin: &[u8]) -> Output {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(binary())
        .args(args)
        .arg("--config")
        .arg(&path)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    finished(args, &out)
}

/// What a finished run of `delay-bridge ARGS` printed; asserts that it did not panic.
fn finished(args: &[&str], out: &std::process::Output) -> Output {
    let out = Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    };
    assert!(!out.text().contains("panicked"), "{args:?}: {}", out.text());
    out
}
