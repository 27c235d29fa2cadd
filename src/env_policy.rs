//! Which environment variables a child may be given.
//!
//! Children are started with an environment built from nothing, so the only way a
//! variable reaches one is that a caller named it. Loader variables are refused rather
//! than dropped: a job spec or a config that asks for `LD_PRELOAD` is either a mistake or
//! an attack, and either way its author must hear about it.

use thiserror::Error;

/// Names the dynamic loaders (glibc's ld.so, musl, macOS dyld) or libc act on before the
/// program's own code runs: they can inject code, redirect libraries or leak files.
/// Every `LD_*` and `DYLD_*` name is refused as well.
pub const LOADER_VARIABLES: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "HOSTALIASES",
    "LOCPATH",
    "MALLOC_TRACE",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
];

/// Why a variable was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("environment variable {name} is refused: loader variables (LD_*, DYLD_*, GCONV_PATH, ...) could inject code into the child")]
    Loader { name: String },
    #[error("environment variable name {name:?} is invalid: it must be non-empty and hold no '=' or NUL")]
    BadName { name: String },
    #[error("environment variable {name} has a NUL byte in its value")]
    BadValue { name: String },
    #[error("malformed environment entry {entry:?}: expected KEY=VALUE")]
    Malformed { entry: String },
}

/// Accepts `name`/`value` as an entry of a child's environment, or says why not.
pub fn check(name: &str, value: &str) -> Result<(), EnvError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(EnvError::BadName {
            name: name.to_owned(),
        });
    }
    if value.contains('\0') {
        return Err(EnvError::BadValue {
            name: name.to_owned(),
        });
    }
    if is_loader_variable(name) {
        return Err(EnvError::Loader {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// True for names that steer the dynamic loader.
pub fn is_loader_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("LD_")
        || upper.starts_with("DYLD_")
        || LOADER_VARIABLES.contains(&upper.as_str())
}

/// Parses a `KEY=VALUE` argument and checks it.
pub fn parse_assignment(entry: &str) -> Result<(String, String), EnvError> {
    let (name, value) = entry.split_once('=').ok_or_else(|| EnvError::Malformed {
        entry: entry.to_owned(),
    })?;
    check(name, value)?;
    Ok((name.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_loader_variables_in_any_case() {
        for name in [
            "LD_PRELOAD",
            "ld_library_path",
            "LD_AUDIT",
            "DYLD_INSERT_LIBRARIES",
            "GCONV_PATH",
        ] {
            assert!(
                matches!(check(name, "x"), Err(EnvError::Loader { .. })),
                "{name}"
            );
        }
    }

    #[test]
    fn accepts_ordinary_names() {
        assert_eq!(check("RUST_LOG", "debug"), Ok(()));
        assert_eq!(check("OLDPWD", "/"), Ok(()));
    }

    #[test]
    fn parses_assignments() {
        assert_eq!(parse_assignment("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(matches!(
            parse_assignment("novalue"),
            Err(EnvError::Malformed { .. })
        ));
        assert!(matches!(
            parse_assignment("=x"),
            Err(EnvError::BadName { .. })
        ));
    }
}
