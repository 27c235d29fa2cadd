//! The host's service manager, as install and uninstall drive it: systemd on Linux,
//! launchd on macOS. Only its command-line tools are used (`systemctl`, `launchctl`), so
//! every action can be printed by `--dry-run` as the command it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::templates::{self, LABEL, PLIST_DIR, UNIT_DIR, UNIT_NAME};
use super::InstallError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Manager {
    Systemd,
    Launchd,
}

/// What the manager says of the service now.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ServiceState {
    /// Running (systemd: active; launchd: loaded).
    pub(crate) running: bool,
    /// Started at boot (systemd: enabled; launchd: loaded daemons start at boot).
    pub(crate) enabled: bool,
}

/// A command and whether its failure stops the install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cmd {
    pub(crate) argv: Vec<String>,
    /// Clean-up that may find nothing to do (`reset-failed` of a unit never failed).
    pub(crate) may_fail: bool,
}

fn cmd(words: &[&str]) -> Cmd {
    Cmd {
        argv: words.iter().map(|w| w.to_string()).collect(),
        may_fail: false,
    }
}

impl Manager {
    /// This host's kind.
    pub(crate) fn host() -> Self {
        if cfg!(target_os = "macos") {
            Self::Launchd
        } else {
            Self::Systemd
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Systemd => "systemd",
            Self::Launchd => "launchd",
        }
    }

    /// Where the service's file goes, on the host.
    pub(crate) fn service_file(self) -> PathBuf {
        match self {
            Self::Systemd => Path::new(UNIT_DIR).join(UNIT_NAME),
            Self::Launchd => Path::new(PLIST_DIR).join(format!("{LABEL}.plist")),
        }
    }

    /// The service's file for a binary under `prefix`.
    pub(crate) fn render(self, prefix: &Path) -> String {
        match self {
            Self::Systemd => templates::unit(prefix),
            Self::Launchd => templates::plist(prefix),
        }
    }

    /// Refuses when the manager is not running here: nothing could be started.
    pub(crate) fn check_running(self) -> Result<(), InstallError> {
        match self {
            // sd_booted(3): this directory exists only when systemd is PID 1.
            Self::Systemd if !Path::new("/run/systemd/system").is_dir() => {
                Err(InstallError::NoServiceManager {
                    manager: self.name(),
                    why: "/run/systemd/system does not exist: systemd is not PID 1 here".into(),
                })
            }
            Self::Launchd if !Path::new("/bin/launchctl").exists() => {
                Err(InstallError::NoServiceManager {
                    manager: self.name(),
                    why: "/bin/launchctl does not exist".into(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Asks the manager about the service.
    pub(crate) fn state(self) -> ServiceState {
        let ok = |argv: &[&str]| {
            Command::new(argv[0])
                .args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        match self {
            Self::Systemd => ServiceState {
                running: ok(&["systemctl", "is-active", "--quiet", UNIT_NAME]),
                enabled: ok(&["systemctl", "is-enabled", "--quiet", UNIT_NAME]),
            },
            Self::Launchd => {
                let loaded = ok(&["launchctl", "print", &format!("system/{LABEL}")]);
                ServiceState {
                    running: loaded,
                    enabled: loaded,
                }
            }
        }
    }

    /// The commands that bring the service to what was written. `file_changed`: the unit
    /// or plist; `config_changed`: the config, token or CA (read again on SIGHUP).
    pub(crate) fn install_commands(
        self,
        now: ServiceState,
        file_changed: bool,
        config_changed: bool,
        start: bool,
    ) -> Vec<Cmd> {
        let mut out = Vec::new();
        match self {
            Self::Systemd => {
                if file_changed {
                    out.push(cmd(&["systemctl", "daemon-reload"]));
                }
                if !now.enabled {
                    out.push(cmd(&["systemctl", "enable", UNIT_NAME]));
                }
                match (start, now.running) {
                    (false, _) => {}
                    (true, false) => out.push(cmd(&["systemctl", "start", UNIT_NAME])),
                    (true, true) if file_changed => {
                        out.push(cmd(&["systemctl", "restart", UNIT_NAME]))
                    }
                    (true, true) if config_changed => {
                        out.push(cmd(&["systemctl", "reload", UNIT_NAME]))
                    }
                    (true, true) => {}
                }
            }
            Self::Launchd => {
                let target = format!("system/{LABEL}");
                let plist = self.service_file().display().to_string();
                // A loaded job keeps the plist it was loaded with: a new one needs a
                // bootout first.
                let reload = now.running && file_changed;
                if reload {
                    out.push(cmd(&["launchctl", "bootout", &target]));
                }
                out.push(cmd(&["launchctl", "enable", &target]));
                if start && (!now.running || reload) {
                    out.push(cmd(&["launchctl", "bootstrap", "system", &plist]));
                } else if start && config_changed {
                    out.push(cmd(&["launchctl", "kill", "HUP", &target]));
                }
            }
        }
        out
    }

    /// The commands that stop and disable the service before its file goes.
    pub(crate) fn stop_commands(self, now: ServiceState) -> Vec<Cmd> {
        match self {
            Self::Systemd if now.running || now.enabled => {
                vec![cmd(&["systemctl", "disable", "--now", UNIT_NAME])]
            }
            Self::Launchd if now.running => {
                vec![
                    cmd(&["launchctl", "bootout", &format!("system/{LABEL}")]),
                    Cmd {
                        may_fail: true,
                        ..cmd(&["launchctl", "disable", &format!("system/{LABEL}")])
                    },
                ]
            }
            _ => Vec::new(),
        }
    }

    /// The commands that forget the service once its file is gone.
    pub(crate) fn forget_commands(self) -> Vec<Cmd> {
        match self {
            Self::Systemd => vec![
                cmd(&["systemctl", "daemon-reload"]),
                Cmd {
                    may_fail: true,
                    ..cmd(&["systemctl", "reset-failed", UNIT_NAME])
                },
            ],
            Self::Launchd => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argvs(cmds: &[Cmd]) -> Vec<String> {
        cmds.iter().map(|c| c.argv.join(" ")).collect()
    }

    #[test]
    fn systemd_does_only_what_the_change_needs() {
        let fresh = ServiceState::default();
        let m = Manager::Systemd;
        assert_eq!(
            argvs(&m.install_commands(fresh, true, true, true)),
            [
                "systemctl daemon-reload",
                "systemctl enable railgrid-agent.service",
                "systemctl start railgrid-agent.service"
            ]
        );
        let up = ServiceState {
            running: true,
            enabled: true,
        };
        assert!(m.install_commands(up, false, false, true).is_empty());
        assert_eq!(
            argvs(&m.install_commands(up, false, true, true)),
            ["systemctl reload railgrid-agent.service"]
        );
        assert_eq!(
            argvs(&m.install_commands(up, true, true, true)),
            [
                "systemctl daemon-reload",
                "systemctl restart railgrid-agent.service"
            ]
        );
        assert_eq!(
            argvs(&m.install_commands(fresh, true, false, false)),
            [
                "systemctl daemon-reload",
                "systemctl enable railgrid-agent.service"
            ],
            "--no-start enables for the next boot only"
        );
    }

    #[test]
    fn launchd_reloads_a_changed_plist() {
        let m = Manager::Launchd;
        let up = ServiceState {
            running: true,
            enabled: true,
        };
        assert_eq!(
            argvs(&m.install_commands(up, true, false, true)),
            [
                "launchctl bootout system/com.railgrid.agent",
                "launchctl enable system/com.railgrid.agent",
                "launchctl bootstrap system /Library/LaunchDaemons/com.railgrid.agent.plist"
            ]
        );
        assert_eq!(
            argvs(&m.install_commands(up, false, true, true)),
            [
                "launchctl enable system/com.railgrid.agent",
                "launchctl kill HUP system/com.railgrid.agent"
            ]
        );
    }
}
