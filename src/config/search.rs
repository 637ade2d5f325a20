//! Where the configuration file is found when `--config` names none.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable naming the configuration file.
pub(crate) const CONFIG_ENV: &str = "DELAY_BRIDGE_CONFIG";

/// The file in the working directory looked for after [`CONFIG_ENV`].
pub(crate) const LOCAL_CONFIG: &str = "delay-bridge.toml";

/// The system-wide file, looked for last (the Debian package installs it).
pub(crate) const SYSTEM_CONFIG: &str = "/etc/delay-bridge/config.toml";

/// No configuration file was found; names every path looked at, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotFound {
    /// The paths tried, in the order they were tried.
    pub tried: Vec<PathBuf>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tried: Vec<String> = self.tried.iter().map(|p| p.display().to_string()).collect();
        write!(
            f,
            "no configuration file found; tried {} (give one with --config FILE)",
            tried.join(", ")
        )
    }
}

impl std::error::Error for NotFound {}

/// The paths looked at without `--config FILE`, in order: `env` (the value of
/// [`CONFIG_ENV`]) when set and not empty, [`LOCAL_CONFIG`], then [`SYSTEM_CONFIG`].
pub(super) fn candidates(env: Option<OsString>) -> Vec<PathBuf> {
    env.filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from(LOCAL_CONFIG), PathBuf::from(SYSTEM_CONFIG)])
        .collect()
}

/// The first of `candidates` that is a file.
pub(super) fn first_existing(candidates: Vec<PathBuf>) -> Result<PathBuf, NotFound> {
    match candidates.iter().position(|p| p.is_file()) {
        Some(i) => Ok(candidates[i].clone()),
        None => Err(NotFound { tried: candidates }),
    }
}

/// The configuration file to load: `explicit` (from `--config FILE`) as given, else the first
/// existing file of [`candidates`] with the process's [`CONFIG_ENV`].
pub(crate) fn find(explicit: Option<&Path>) -> Result<PathBuf, NotFound> {
    match explicit {
        Some(path) => Ok(path.to_path_buf()),
        None => first_existing(candidates(std::env::var_os(CONFIG_ENV))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_order_is_env_then_local_then_system() {
        assert_eq!(
            candidates(Some("/srv/bridge.toml".into())),
            [
                PathBuf::from("/srv/bridge.toml"),
                PathBuf::from("delay-bridge.toml"),
                PathBuf::from("/etc/delay-bridge/config.toml"),
            ]
        );
        // Unset or empty: the variable is skipped.
        for env in [None, Some(OsString::new())] {
            assert_eq!(
                candidates(env),
                [
                    PathBuf::from("delay-bridge.toml"),
                    PathBuf::from("/etc/delay-bridge/config.toml"),
                ]
            );
        }
    }

    #[test]
    fn the_first_existing_file_wins_and_a_miss_names_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a.toml"),
            dir.path().join("b.toml"),
            dir.path().join("c.toml"),
        );
        let all = || vec![a.clone(), b.clone(), c.clone()];
        let err = first_existing(all()).unwrap_err();
        assert_eq!(err.tried, all());
        let text = err.to_string();
        for p in all() {
            assert!(text.contains(&p.display().to_string()), "{text}");
        }
        std::fs::write(&c, "").unwrap();
        assert_eq!(first_existing(all()).unwrap(), c);
        std::fs::write(&b, "").unwrap();
        assert_eq!(first_existing(all()).unwrap(), b);
        // A directory is not a configuration file.
        std::fs::create_dir(&a).unwrap();
        assert_eq!(first_existing(all()).unwrap(), b);
    }

    #[test]
    fn an_explicit_path_is_taken_as_given() {
        let path = Path::new("/does/not/exist.toml");
        assert_eq!(find(Some(path)).unwrap(), path);
    }
}
