//! The fixture backend: a [`GpuSnapshot`] as JSON in a file.
//!
//! The file is read again on every run, so tests and simulated nodes change what the agent sees by
//! rewriting it at any time. A missing, truncated or mistyped file is an error for that run (the
//! check reports it as `unknown`), never a panic.

use std::io::Read;
use std::path::PathBuf;

use super::{GpuBackend, GpuBackendError, GpuSnapshot};

/// Larger files are refused: a snapshot of a big node is a few hundred KiB.
const MAX_FIXTURE_BYTES: u64 = 16 * 1024 * 1024;

/// Reads a [`GpuSnapshot`] from `path` on every snapshot.
#[derive(Debug, Clone)]
pub struct FixtureBackend {
    path: PathBuf,
}

impl FixtureBackend {
    pub fn new(path: PathBuf) -> Self {
        FixtureBackend { path }
    }

    fn read(&self) -> Result<String, GpuBackendError> {
        let read_err = |source| GpuBackendError::FixtureRead { path: self.path.clone(), source };
        let file = std::fs::File::open(&self.path).map_err(read_err)?;
        let mut text = String::new();
        file.take(MAX_FIXTURE_BYTES + 1).read_to_string(&mut text).map_err(read_err)?;
        if text.len() as u64 > MAX_FIXTURE_BYTES {
            return Err(GpuBackendError::FixtureParse {
                path: self.path.clone(),
                message: format!("larger than {MAX_FIXTURE_BYTES} bytes"),
            });
        }
        Ok(text)
    }
}

/// Parses a fixture's text; `path` only names it in errors.
pub fn parse_snapshot(path: &std::path::Path, text: &str) -> Result<GpuSnapshot, GpuBackendError> {
    let parse_err =
        |message: String| GpuBackendError::FixtureParse { path: path.to_owned(), message };
    let snapshot: GpuSnapshot =
        serde_json::from_str(text).map_err(|err| parse_err(err.to_string()))?;
    let problems = snapshot.problems();
    if problems.is_empty() { Ok(snapshot) } else { Err(parse_err(problems.join("; "))) }
}

impl GpuBackend for FixtureBackend {
    fn snapshot(&mut self) -> Result<GpuSnapshot, GpuBackendError> {
        let text = self.read()?;
        parse_snapshot(&self.path, &text)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_file_again_on_every_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.json");
        std::fs::write(&path, r#"{"gpus":[{"index":0}]}"#).unwrap();
        let mut backend = FixtureBackend::new(path.clone());
        assert_eq!(backend.snapshot().unwrap().gpus.len(), 1);
        std::fs::write(&path, r#"{"gpus":[{"index":0},{"index":1}]}"#).unwrap();
        assert_eq!(backend.snapshot().unwrap().gpus.len(), 2);
    }

    #[test]
    fn missing_truncated_and_mistyped_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.json");
        let mut backend = FixtureBackend::new(path.clone());
        let err = backend.snapshot().unwrap_err();
        assert!(matches!(err, GpuBackendError::FixtureRead { .. }), "{err}");
        assert!(err.to_string().contains("gpu.json"), "{err}");

        std::fs::write(&path, r#"{"gpus":[{"index":0,"#).unwrap();
        let err = backend.snapshot().unwrap_err();
        assert!(matches!(err, GpuBackendError::FixtureParse { .. }), "{err}");

        std::fs::write(&path, r#"{"gpus":[{"index":"zero"}]}"#).unwrap();
        let err = backend.snapshot().unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");

        std::fs::write(&path, r#"{"gpus":[{"index":3},{"index":3}]}"#).unwrap();
        let err = backend.snapshot().unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
    }
}
