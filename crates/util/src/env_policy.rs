//! Which environment variables a child may be given.
//!
//! Children are started with an environment built from nothing, so the only way a
//! variable reaches one is that a caller named it. Loader variables (every `LD_*` and
//! `DYLD_*`) and the rest of glibc's list of variables unsafe for privileged programs are
//! refused rather than dropped: a job spec or a config that asks for `LD_PRELOAD` or
//! `GLIBC_TUNABLES` is either a mistake or an attack, and either way its author must hear
//! about it.

use thiserror::Error;

use crate::clip;

/// The variables glibc removes from the environment of set-user-id and set-group-id
/// programs (`UNSECURE_ENVVARS` in glibc's `sysdeps/generic/unsecvars.h`; `GLIBC_TUNABLES`
/// is filtered by glibc's tunables code where that is built), less `TMPDIR` (see
/// [`ALLOWED_FROM_GLIBC_LIST`]). They steer the
/// dynamic loader (`LD_*`, `GLIBC_TUNABLES`), and what libc loads or opens by path before
/// or beside the program's own code: character-set converters (`GCONV_PATH`), locales
/// (`LOCPATH`, `NLSPATH`), time zones (`TZDIR`), the resolver (`HOSTALIASES`,
/// `LOCALDOMAIN`, `RES_OPTIONS`, `RESOLV_HOST_CONF`), NIS, malloc tracing. No child of
/// railgrid needs them from a caller, and each has carried exploits
/// (`GLIBC_TUNABLES`: CVE-2023-4911), so they are refused rather than passed on.
pub const GLIBC_UNSECURE_VARIABLES: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_DYNAMIC_WEAK",
    "LD_HWCAP_MASK",
    "LD_LIBRARY_PATH",
    "LD_ORIGIN_PATH",
    "LD_PRELOAD",
    "LD_PROFILE",
    "LD_SHOW_AUXV",
    "LD_USE_LOAD_BIAS",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TZDIR",
];

/// On glibc's list but accepted: `TMPDIR`. The runner sets it for every job (to the
/// job's workspace `tmp/`), and build tools commonly point it elsewhere. glibc drops it
/// for privileged programs so that an unprivileged caller cannot choose where they make
/// temporary files; a child of railgrid runs with no more privilege than whoever set the
/// variable (set-user-id programs it starts are scrubbed by glibc itself, and get no
/// privileges at all under Landlock's `no_new_privs`).
pub const ALLOWED_FROM_GLIBC_LIST: &[&str] = &["TMPDIR"];

/// Why a variable was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("environment variable {} is refused: loader variables (LD_*, DYLD_*) could inject code into the child", clip(.name))]
    Loader { name: String },
    #[error("environment variable {} is refused: it is on glibc's list of variables unsafe to pass to privileged programs (GLIBC_TUNABLES, GCONV_PATH, LOCPATH, TZDIR, resolver and NIS paths, ...), which railgrid refuses for every child", clip(.name))]
    Unsecure { name: String },
    #[error("environment variable name {:?} is invalid: it must be non-empty and hold no '=' or NUL", clip(.name))]
    BadName { name: String },
    #[error("environment variable {} has a NUL byte in its value", clip(.name))]
    BadValue { name: String },
    #[error("malformed environment entry {:?}: expected KEY=VALUE", clip(.entry))]
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
    // Case-insensitive: no loader honours `ld_preload`, but no caller needs it either,
    // and a name that looks like one is a mistake or a probe.
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("LD_") || upper.starts_with("DYLD_") {
        return Err(EnvError::Loader {
            name: name.to_owned(),
        });
    }
    if GLIBC_UNSECURE_VARIABLES.contains(&upper.as_str()) {
        return Err(EnvError::Unsecure {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Parses a `KEY=VALUE` argument and checks it.
pub fn parse_assignment(entry: &str) -> Result<(String, String), EnvError> {
    let (name, value) = entry.split_once('=').ok_or_else(|| EnvError::Malformed {
        entry: entry.to_owned(),
    })?;
    check(name, value)?;
    Ok((name.to_owned(), value.to_owned()))
}

/// A runner-wide PATH for jobs: absolute directories only (a relative entry would be
/// resolved from each job's working directory, which the job controls), no empty entry.
/// Returns it as given, or what is wrong with it.
pub fn check_search_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("an empty PATH: list absolute directories separated by ':'".into());
    }
    for dir in path.split(':') {
        if !dir.starts_with('/') {
            return Err(format!(
                "PATH entry {dir:?} is not an absolute directory: a relative one would be looked up from each job's working directory"
            ));
        }
    }
    Ok(path.to_owned())
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
            "LD_BIND_NOW",
            "DYLD_INSERT_LIBRARIES",
            "dyld_library_path",
        ] {
            assert_eq!(
                check(name, "x"),
                Err(EnvError::Loader { name: name.into() }),
                "{name}"
            );
        }
    }

    #[test]
    fn refuses_all_of_glibcs_unsecure_list_but_tmpdir_naming_the_variable() {
        for &name in GLIBC_UNSECURE_VARIABLES {
            let err = check(name, "x").expect_err(name);
            assert!(err.to_string().contains(name), "{err}");
            if !name.starts_with("LD_") {
                assert_eq!(err, EnvError::Unsecure { name: name.into() });
            }
            let lower = name.to_ascii_lowercase();
            assert!(check(&lower, "x").is_err(), "{lower}");
        }
        for name in [
            "GLIBC_TUNABLES",
            "LOCALDOMAIN",
            "NIS_PATH",
            "TZDIR",
            "HOSTALIASES",
        ] {
            assert!(GLIBC_UNSECURE_VARIABLES.contains(&name), "{name}");
        }
        for &name in ALLOWED_FROM_GLIBC_LIST {
            assert_eq!(check(name, "/var/tmp/build"), Ok(()), "{name}");
            assert!(!GLIBC_UNSECURE_VARIABLES.contains(&name));
        }
    }

    #[test]
    fn accepts_ordinary_names() {
        assert_eq!(check("RUST_LOG", "debug"), Ok(()));
        assert_eq!(check("OLDPWD", "/"), Ok(()));
        assert_eq!(check("TZ", "UTC"), Ok(()));
        assert_eq!(check("MALLOC_ARENA_MAX", "2"), Ok(()));
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
