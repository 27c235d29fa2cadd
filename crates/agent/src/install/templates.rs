//! The systemd unit and the launchd plist, rendered from the files in `packaging/`: those
//! files are the templates, embedded here, so what a package ships by hand and what
//! `agent install` writes cannot drift apart.
//!
//! The templates name the default prefix (`/usr/local`) literally, so that they stay
//! usable as they are; rendering replaces the binary's directory and nothing else (the
//! plist's PATH keeps `/usr/local/bin`, which is the supervisor's default).

use std::path::Path;

/// The unit as shipped.
pub const UNIT_TEMPLATE: &str =
    include_str!("../../../../packaging/systemd/railgrid-agent.service");
/// The plist as shipped.
pub const PLIST_TEMPLATE: &str =
    include_str!("../../../../packaging/launchd/com.railgrid.agent.plist");

/// The unit's name, and where systemd reads it.
pub const UNIT_NAME: &str = "railgrid-agent.service";
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// The daemon's label, and where launchd reads it.
pub const LABEL: &str = "com.railgrid.agent";
pub const PLIST_DIR: &str = "/Library/LaunchDaemons";

const DEFAULT_BIN: &str = "/usr/local/bin/railgrid";
const DEFAULT_RW_PATHS: &str = "ReadWritePaths=/usr/local/bin\n";

/// A prefix goes into a unit's command lines and an XML string unquoted: only an absolute
/// path of plain characters is accepted, so rendering needs no escaping at all.
pub fn check_prefix(prefix: &Path) -> Result<(), String> {
    check_plain(prefix).map_err(|()| {
        format!(
            "--prefix {}: give an absolute path of letters, digits and / . _ - + (no .., // or trailing /)",
            prefix.display()
        )
    })
}

/// An absolute path that needs no quoting in a unit or a plist.
pub(crate) fn check_plain(prefix: &Path) -> Result<(), ()> {
    let text = prefix.to_str().unwrap_or("");
    let plain = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+'));
    let normal = prefix.components().all(|c| {
        matches!(
            c,
            std::path::Component::RootDir | std::path::Component::Normal(_)
        )
    }) && prefix
        .components()
        .collect::<std::path::PathBuf>()
        .as_os_str()
        == prefix.as_os_str();
    if !prefix.is_absolute() || !plain || !normal || text.len() > 200 || text == "/" {
        return Err(());
    }
    Ok(())
}

/// `<prefix>/bin/railgrid`.
pub fn binary_path(prefix: &Path) -> std::path::PathBuf {
    prefix.join("bin").join("railgrid")
}

/// The upgrade guard's directories, as the template names them.
const DEFAULT_GUARD_DIRS: &str = "--state-dir /var/lib/railgrid --log-dir /var/log/railgrid";
/// `agent reload`'s state directory, likewise.
const DEFAULT_RELOAD_DIR: &str = "agent reload --state-dir /var/lib/railgrid ";

/// The unit for a binary under `prefix` (checked by [`check_prefix`]), whose agent keeps
/// its state and logs in `dirs` (checked likewise): the upgrade guard and `agent reload`
/// must look there.
pub fn unit(prefix: &Path, dirs: (&Path, &Path)) -> String {
    let bin = binary_path(prefix);
    let bin_dir = prefix.join("bin");
    UNIT_TEMPLATE
        .replace(
            DEFAULT_GUARD_DIRS,
            &format!(
                "--state-dir {} --log-dir {}",
                dirs.0.display(),
                dirs.1.display()
            ),
        )
        .replace(
            DEFAULT_RELOAD_DIR,
            &format!("agent reload --state-dir {} ", dirs.0.display()),
        )
        .replace(
            DEFAULT_RW_PATHS,
            &format!("ReadWritePaths={}\n", bin_dir.display()),
        )
        .replace(DEFAULT_BIN, &bin.display().to_string())
}

/// The plist for a binary under `prefix` (checked by [`check_prefix`]).
pub fn plist(prefix: &Path) -> String {
    let bin = binary_path(prefix);
    PLIST_TEMPLATE.replace(
        &format!("<string>{DEFAULT_BIN}</string>"),
        &format!("<string>{}</string>", bin.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The prefix the templates are written for.
    const DEFAULT_PREFIX: &str = "/usr/local";
    const DEFAULT_DIRS: (&str, &str) = ("/var/lib/railgrid", "/var/log/railgrid");

    fn default_dirs() -> (&'static Path, &'static Path) {
        (Path::new(DEFAULT_DIRS.0), Path::new(DEFAULT_DIRS.1))
    }

    #[test]
    fn the_default_prefix_renders_the_templates_unchanged() {
        assert_eq!(
            unit(Path::new(DEFAULT_PREFIX), default_dirs()),
            UNIT_TEMPLATE
        );
        assert_eq!(plist(Path::new(DEFAULT_PREFIX)), PLIST_TEMPLATE);
    }

    #[test]
    fn another_prefix_moves_every_use_of_the_binary_and_its_directory() {
        let unit = unit(
            Path::new("/opt/rg"),
            (Path::new("/srv/rg"), Path::new("/srv/rg-log")),
        );
        for line in unit.lines().filter(|l| !l.starts_with('#')) {
            assert!(!line.contains("/usr/local"), "{line}");
        }
        assert!(unit.contains(
            "\nExecStart=/opt/rg/bin/railgrid agent run --config /etc/railgrid/agent.toml\n"
        ));
        assert!(unit.contains(
            "\nExecStartPre=-/opt/rg/bin/railgrid.prev agent upgrade-guard --state-dir /srv/rg --log-dir /srv/rg-log\n"
        ));
        assert!(unit.contains(
            "\nExecReload=/opt/rg/bin/railgrid agent reload --state-dir /srv/rg --pid $MAINPID\n"
        ));
        assert!(unit.contains("\nReadWritePaths=/opt/rg/bin\n"));

        let plist = plist(Path::new("/opt/rg"));
        assert!(plist.contains("<string>/opt/rg/bin/railgrid</string>"));
        assert!(!plist.contains("/usr/local/bin/railgrid"));
        assert!(
            plist.contains(&format!(
                "<string>{}</string>",
                crate::supervisor::DEFAULT_PATH
            )),
            "the PATH is the supervisor's default, whatever the prefix"
        );
    }

    #[test]
    fn prefixes_that_would_need_quoting_are_refused() {
        for bad in [
            "opt",
            "/opt/my rg",
            "/opt/../etc",
            "/opt/$x",
            "/opt/a\"b",
            "/opt/<x>",
            "/opt//x",
            "/opt/x/",
            "/opt/./x",
            "/",
        ] {
            assert!(check_prefix(Path::new(bad)).is_err(), "{bad}");
        }
        for good in ["/usr/local", "/opt/railgrid-1.2", "/usr"] {
            assert!(check_prefix(Path::new(good)).is_ok(), "{good}");
        }
    }

    fn plist_dict(text: &str) -> plist::Dictionary {
        plist::Value::from_reader_xml(text.as_bytes())
            .expect("the plist parses")
            .into_dictionary()
            .expect("a dictionary at the top")
    }

    #[test]
    fn the_plist_parses_and_says_what_launchd_needs() {
        let d = plist_dict(&plist(Path::new("/opt/rg")));
        let string = |k: &str| d.get(k).and_then(|v| v.as_string()).map(str::to_owned);
        let boolean = |k: &str| d.get(k).and_then(plist::Value::as_boolean);
        let int = |k: &str| d.get(k).and_then(plist::Value::as_signed_integer);
        assert_eq!(string("Label").as_deref(), Some(LABEL));
        let args: Vec<String> = d["ProgramArguments"]
            .as_array()
            .expect("ProgramArguments is an array")
            .iter()
            .map(|v| v.as_string().expect("strings").to_owned())
            .collect();
        assert_eq!(
            args,
            [
                "/opt/rg/bin/railgrid",
                "agent",
                "run",
                "--config",
                "/etc/railgrid/agent.toml"
            ]
        );
        assert_eq!(boolean("RunAtLoad"), Some(true));
        assert_eq!(boolean("KeepAlive"), Some(true));
        assert!(int("ThrottleInterval").is_some_and(|s| s >= 1));
        assert_eq!(string("ProcessType").as_deref(), Some("Interactive"));
        assert_eq!(int("Umask"), Some(0o077));
        let stop = int("ExitTimeOut").expect("ExitTimeOut");
        assert!(stop as u64 >= crate::SERVICE_STOP_TIMEOUT.as_secs());
        for k in ["StandardOutPath", "StandardErrorPath"] {
            let path = PathBuf::from(string(k).unwrap_or_else(|| panic!("{k}")));
            assert!(
                path.starts_with(crate::config::ROOT_LOG_DIR),
                "{k} {} is in the log directory",
                path.display()
            );
        }
        let env = d["EnvironmentVariables"]
            .as_dictionary()
            .expect("EnvironmentVariables");
        assert_eq!(
            env.get("PATH").and_then(|v| v.as_string()),
            Some(crate::supervisor::DEFAULT_PATH)
        );
        assert_eq!(env.len(), 1, "nothing else reaches the agent's environment");
    }

    #[test]
    fn the_unit_keeps_the_binary_directory_writable_and_the_guard_in_step() {
        let unit = unit(Path::new(DEFAULT_PREFIX), default_dirs());
        let value = |key: &str| {
            unit.lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in the unit"))
        };
        assert_eq!(value("Type="), "notify");
        assert_eq!(value("Restart="), "always");
        assert_eq!(value("KillMode="), "mixed");
        assert_eq!(value("Delegate="), "yes");
        assert_eq!(
            value("OOMPolicy="),
            "continue",
            "a job's OOM is not the service's"
        );
        assert_eq!(value("NoNewPrivileges="), "yes");
        assert_eq!(value("ProtectSystem="), "full");
        assert_eq!(value("ReadWritePaths="), "/usr/local/bin");
        assert_eq!(value("StateDirectory="), "railgrid");
        assert_eq!(value("LogsDirectory="), "railgrid");
        assert_eq!(value("ConfigurationDirectory="), "railgrid");
        assert!(value("WatchdogSec=").ends_with('s'));
        // The guard names the directories the unit creates and the agent's defaults.
        let guard = value("ExecStartPre=");
        assert!(guard.contains(&format!("--state-dir {}", crate::config::ROOT_STATE_DIR)));
        assert!(guard.contains(&format!("--log-dir {}", crate::config::ROOT_LOG_DIR)));
        assert!(value("ExecStart=").ends_with(&format!("--config {}", crate::config::ROOT_CONFIG)));
    }
}
