//! `railgrid release keygen|sign|verify`: a release's signing keys and signatures.

use std::process::ExitCode;

use super::{print_stdout, usage};
use crate::cli::ReleaseCommand;
use crate::file_error::FileError;
use crate::release::{self, ReleaseError};

fn classify(e: ReleaseError) -> anyhow::Error {
    if e.is_usage() {
        usage(e)
    } else {
        e.into()
    }
}

pub(super) fn run(command: ReleaseCommand) -> anyhow::Result<ExitCode> {
    let text = release_command(command).map_err(classify)?;
    print_stdout(&text)
}

/// What the command prints.
fn release_command(command: ReleaseCommand) -> Result<String, ReleaseError> {
    let password =
        |f: Option<std::path::PathBuf>| f.map(|p| release::read_password(&p)).transpose();
    match command {
        ReleaseCommand::Keygen {
            secret_key,
            public_key,
            password_file,
        } => {
            let (line, id) = release::keygen(&secret_key, &public_key, password(password_file)?)?;
            Ok(format!(
                "key {id}: secret key in {}, public key in {}\nfor an agent's [upgrade] trusted_keys: {line}",
                secret_key.display(),
                public_key.display()
            ))
        }
        ReleaseCommand::Sign {
            secret_key,
            password_file,
            version,
            file,
        } => {
            let version = match version {
                Some(v) if crate::proto::desired::is_version(&v) => v,
                Some(v) => {
                    return Err(ReleaseError::Version {
                        path: file,
                        why: format!("{v:?} is not a version (1 to 64 of A-Z a-z 0-9 . + - _)"),
                    })
                }
                None => release::version_of(&file)?,
            };
            let (sig, trusted) =
                release::sign(&secret_key, password(password_file)?, &file, &version)?;
            Ok(format!(
                "signed {} as version {version}: {}\ntrusted comment: {trusted}",
                file.display(),
                sig.display()
            ))
        }
        ReleaseCommand::Verify {
            public_key,
            signature,
            file,
            json,
        } => {
            let text = crate::small_file::read_string(&public_key, crate::small_file::TOKEN_MAX)
                .map_err(FileError::read(&public_key))?;
            let key = release::public_key(&text, &public_key)?;
            let v = release::verify(&key, &file, signature.as_deref())?;
            if json {
                return Ok(serde_json::json!({
                    "file": file,
                    "verified": true,
                    "key_id": v.key_id,
                    "trusted_comment": v.trusted_comment,
                })
                .to_string());
            }
            Ok(format!(
                "{}: signature by key {} verified\ntrusted comment: {}",
                file.display(),
                v.key_id,
                v.trusted_comment
            ))
        }
    }
}
