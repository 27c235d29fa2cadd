//! The one I/O error the rooms share: what was done to which path, with the system's
//! reason as its source. Each module's error wraps it (`#[error(transparent)]`), so a
//! failed read says the same thing wherever it happens.

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum FileError {
    #[error("could not read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// For `map_err`: reading `path` failed.
    pub fn read(path: impl AsRef<Path>) -> impl FnOnce(io::Error) -> Self {
        let path = path.as_ref().to_owned();
        move |source| Self::Read { path, source }
    }

    /// For `map_err`: writing `path` failed.
    pub fn write(path: impl AsRef<Path>) -> impl FnOnce(io::Error) -> Self {
        let path = path.as_ref().to_owned();
        move |source| Self::Write { path, source }
    }

    /// For `map_err`: removing `path` failed.
    pub fn remove(path: impl AsRef<Path>) -> impl FnOnce(io::Error) -> Self {
        let path = path.as_ref().to_owned();
        move |source| Self::Remove { path, source }
    }
}
