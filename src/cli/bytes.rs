//! Bytes on the command line: a member or payload given as it is, as `-` (standard input),
//! with `--file PATH`, or in base64 with `--base64`, the same way in every command.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use base64::Engine;
use clap::Args;

/// How the values of a command's member or payload arguments are given: shared by every
/// command that takes one, so that each takes the same forms.
#[derive(Debug, Clone, Default, Args)]
pub struct ByteForms {
    /// Read the value from this file, byte for byte, instead of the command line (a
    /// value of `-` reads standard input instead).
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// The value (given, read from --file or from standard input) is base64, standard or
    /// URL-safe, padded or not: what `--json` prints for a member that is not UTF-8.
    #[arg(long)]
    pub base64: bool,
}

impl ByteForms {
    /// The values `given` on the command line (each as it is, `-` for standard input, which
    /// is read once), or the file's content alone; each decoded from base64 with `--base64`.
    pub fn values(&self, given: &[OsString]) -> anyhow::Result<Vec<Vec<u8>>> {
        let raw = match &self.file {
            Some(path) => {
                anyhow::ensure!(
                    given.is_empty(),
                    "give the value either with --file or on the command line, not both"
                );
                vec![std::fs::read(path).with_context(|| format!("reading {}", path.display()))?]
            }
            None => {
                let stdin = given.iter().filter(|g| g.as_os_str() == "-").count();
                anyhow::ensure!(stdin <= 1, "standard input (`-`) can be read only once");
                given
                    .iter()
                    .map(|g| match g.as_os_str() == "-" {
                        true => read_stdin(),
                        false => Ok(os_bytes(g)),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
        };
        if !self.base64 {
            return Ok(raw);
        }
        raw.iter().map(|v| decode_base64(v)).collect()
    }

    /// The one value of a command taking one: `given`, or the file's content.
    pub fn value(&self, given: Option<&OsString>) -> anyhow::Result<Vec<u8>> {
        let given: Vec<OsString> = given.cloned().into_iter().collect();
        anyhow::ensure!(
            self.file.is_some() || !given.is_empty(),
            "give a value: on the command line, `-` for standard input, or --file PATH"
        );
        let mut values = self.values(&given)?;
        Ok(values.swap_remove(0))
    }
}

/// The bytes of a command-line argument as the operating system gave them: any bytes on
/// Unix, so that a member that is not UTF-8 (`$'\xff'` in a shell) is taken as it is.
pub(super) fn os_bytes(arg: &OsStr) -> Vec<u8> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        arg.as_bytes().to_vec()
    }
    #[cfg(not(unix))]
    {
        arg.to_string_lossy().into_owned().into_bytes()
    }
}

fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut all = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut all)
        .context("reading standard input")?;
    Ok(all)
}

/// Standard or URL-safe base64, padded or not, ASCII whitespace (line breaks) ignored.
pub(super) fn decode_base64(text: &[u8]) -> anyhow::Result<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let clean: Vec<u8> = text
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .collect();
    STANDARD_NO_PAD
        .decode(&clean)
        .or_else(|_| URL_SAFE_NO_PAD.decode(&clean))
        .map_err(|e| anyhow::anyhow!("--base64: not base64: {e}"))
}

/// Standard base64, as `--json` prints members that are not UTF-8.
pub(super) fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forms(base64: bool) -> ByteForms {
        ByteForms { file: None, base64 }
    }

    #[test]
    fn values_are_taken_as_given_or_decoded() {
        let given = [OsString::from("a b"), OsString::from("c")];
        assert_eq!(
            forms(false).values(&given).unwrap(),
            [b"a b".to_vec(), b"c".to_vec()]
        );
        let given = [
            OsString::from("/wBh"),
            OsString::from("_wBh"),
            OsString::from("/w=="),
        ];
        assert_eq!(
            forms(true).values(&given).unwrap(),
            [b"\xff\0a".to_vec(), b"\xff\0a".to_vec(), b"\xff".to_vec()]
        );
        assert!(forms(true).values(&[OsString::from("***")]).is_err());
        let twice = [OsString::from("-"), OsString::from("-")];
        assert!(forms(false).values(&twice).is_err());
        assert!(forms(false).value(None).is_err());
    }

    #[test]
    fn a_file_is_read_byte_for_byte_and_excludes_a_given_value() {
        let path = std::env::temp_dir().join(format!("delay-bridge-bytes-{}", std::process::id()));
        std::fs::write(&path, b"\x00\xff\n").unwrap();
        let f = ByteForms {
            file: Some(path.clone()),
            base64: false,
        };
        assert_eq!(f.value(None).unwrap(), b"\x00\xff\n");
        assert!(f.value(Some(&OsString::from("x"))).is_err());
        std::fs::remove_file(path).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn arguments_keep_bytes_that_are_not_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let arg = OsString::from_vec(b"\xffm".to_vec());
        assert_eq!(forms(false).value(Some(&arg)).unwrap(), b"\xffm");
    }
}
