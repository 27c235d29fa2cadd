//! The host's service manager, as install and uninstall drive it: systemd on Linux,
//! launchd on macOS. Only its command-line tools are used (`systemctl`, `launchctl`), so
//! every action can be printed by `--dry-run` as the command it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::templates::{self, LABEL, PLIST_DIR, UNIT_DIR, UNIT_NAME};
use super::InstallError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Manager {
    Systemd,
    Launchd,
}

/// What the manager says of the service now.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ServiceState {
    /// Running, starting or stopping (systemd: active, activating, deactivating,
    /// reloading; launchd: loaded).
    pub running: bool,
    /// Started at boot (systemd: enabled; launchd: loaded daemons start at boot).
    pub enabled: bool,
    /// systemd has an older copy of the unit than the file (an earlier run stopped
    /// between writing it and `daemon-reload`).
    pub stale: bool,
}

/// What changed, as the service manager must hear of it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Changes {
    /// The unit or plist.
    pub service_file: bool,
    /// The config, token or CA: a reload (SIGHUP) takes them.
    pub config: bool,
    /// What only a restart takes: the binary (stopped before it is replaced, so that
    /// the agent's own lockstep does not race the restart), a hub added or removed.
    pub restart: bool,
}

/// A command and whether its failure stops the install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cmd {
    pub argv: Vec<String>,
    /// Clean-up that may find nothing to do (`reset-failed` of a unit never failed).
    pub may_fail: bool,
    /// Tried again for a while: `launchctl bootstrap` fails while the job it replaces is
    /// still exiting.
    pub retry: bool,
}

fn cmd(words: &[&str]) -> Cmd {
    Cmd {
        argv: words.iter().map(|w| w.to_string()).collect(),
        may_fail: false,
        retry: false,
    }
}

impl Manager {
    /// This host's kind.
    pub(super) fn host() -> Self {
        if cfg!(target_os = "macos") {
            Self::Launchd
        } else {
            Self::Systemd
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Systemd => "systemd",
            Self::Launchd => "launchd",
        }
    }

    /// Where the service's file goes, on the host.
    pub(super) fn service_file(self) -> PathBuf {
        match self {
            Self::Systemd => Path::new(UNIT_DIR).join(UNIT_NAME),
            Self::Launchd => Path::new(PLIST_DIR).join(format!("{LABEL}.plist")),
        }
    }

    /// The service's file for a binary under `prefix`.
    pub(super) fn render(self, prefix: &Path, dirs: (&Path, &Path)) -> String {
        match self {
            Self::Systemd => templates::unit(prefix, dirs),
            Self::Launchd => templates::plist(prefix),
        }
    }

    /// Refuses when the manager is not running here: nothing could be started.
    pub(super) fn check_running(self) -> Result<(), InstallError> {
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
    pub(super) fn state(self) -> ServiceState {
        // Its stdout, whatever the exit status (`is-active` prints `inactive` and exits
        // 3), and whether it succeeded.
        let run = |argv: &[&str]| -> (String, bool) {
            Command::new(argv[0])
                .args(&argv[1..])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .map(|o| {
                    let text = String::from_utf8_lossy(&o.stdout).trim().to_owned();
                    (text, o.status.success())
                })
                .unwrap_or_default()
        };
        match self {
            Self::Systemd => {
                let active = run(&["systemctl", "is-active", UNIT_NAME]).0;
                let enabled = run(&["systemctl", "is-enabled", UNIT_NAME]).0;
                let stale = run(&[
                    "systemctl",
                    "show",
                    "-p",
                    "NeedDaemonReload",
                    "--value",
                    UNIT_NAME,
                ])
                .0;
                ServiceState {
                    running: matches!(
                        active.as_str(),
                        "active" | "activating" | "deactivating" | "reloading"
                    ),
                    enabled: matches!(enabled.as_str(), "enabled" | "enabled-runtime"),
                    stale: stale == "yes",
                }
            }
            Self::Launchd => {
                let loaded = run(&["launchctl", "print", &format!("system/{LABEL}")]).1;
                ServiceState {
                    running: loaded,
                    enabled: loaded,
                    stale: false,
                }
            }
        }
    }

    /// The commands that stop the service before its binary is replaced.
    pub(super) fn stop_first(self, now: ServiceState, changes: Changes) -> Vec<Cmd> {
        if !(now.running && changes.restart) {
            return Vec::new();
        }
        match self {
            Self::Systemd => vec![cmd(&["systemctl", "stop", UNIT_NAME])],
            Self::Launchd => vec![cmd(&["launchctl", "bootout", &format!("system/{LABEL}")])],
        }
    }

    /// The commands that bring the service to what was written, once every file is
    /// (after [`Manager::stop_first`]'s, when it gave any).
    pub(super) fn install_commands(
        self,
        now: ServiceState,
        changes: Changes,
        start: bool,
    ) -> Vec<Cmd> {
        let mut out = Vec::new();
        // Stopped by stop_first.
        let running = now.running && !changes.restart;
        match self {
            Self::Systemd => {
                if changes.service_file || now.stale {
                    out.push(cmd(&["systemctl", "daemon-reload"]));
                }
                if !now.enabled {
                    out.push(cmd(&["systemctl", "enable", UNIT_NAME]));
                }
                // A unit that failed (exit 2, the start limit) starts only after this.
                let reset = Cmd {
                    may_fail: true,
                    ..cmd(&["systemctl", "reset-failed", UNIT_NAME])
                };
                match (start || now.running, running) {
                    (false, _) => {}
                    (true, false) => out.extend([reset, cmd(&["systemctl", "start", UNIT_NAME])]),
                    (true, true) if changes.service_file || now.stale => {
                        out.extend([reset, cmd(&["systemctl", "restart", UNIT_NAME])])
                    }
                    (true, true) if changes.config => {
                        out.push(cmd(&["systemctl", "reload", UNIT_NAME]))
                    }
                    (true, true) => {}
                }
            }
            Self::Launchd => {
                let target = format!("system/{LABEL}");
                let plist = self.service_file().display().to_string();
                // A loaded job keeps the plist it was loaded with: a new one needs a
                // bootout first, and the bootstrap is retried while the old job exits.
                let reload = running && changes.service_file && start;
                if reload {
                    out.push(cmd(&["launchctl", "bootout", &target]));
                }
                let bootstrap = Cmd {
                    retry: true,
                    ..cmd(&["launchctl", "bootstrap", "system", &plist])
                };
                if (start || now.running) && (!running || reload) {
                    out.push(cmd(&["launchctl", "enable", &target]));
                    out.push(bootstrap);
                } else if !running {
                    out.push(cmd(&["launchctl", "enable", &target]));
                } else if changes.config {
                    out.push(Cmd {
                        may_fail: true,
                        ..cmd(&["launchctl", "kill", "HUP", &target])
                    });
                }
            }
        }
        out
    }

    /// The commands that stop and disable the service (and an upgrade's watcher, which
    /// would put a binary back) before its files go.
    pub(super) fn stop_commands(self, now: ServiceState, has_file: bool) -> Vec<Cmd> {
        let may_fail = |words: &[&str]| Cmd {
            may_fail: true,
            ..cmd(words)
        };
        match self {
            Self::Systemd if now.running || now.enabled || has_file => vec![
                may_fail(&["systemctl", "stop", "railgrid-upgrade-watch-*"]),
                cmd(&["systemctl", "disable", "--now", UNIT_NAME]),
            ],
            Self::Launchd if now.running => {
                vec![cmd(&["launchctl", "bootout", &format!("system/{LABEL}")])]
            }
            _ => Vec::new(),
        }
    }

    /// The commands that forget the service once its file is gone.
    pub(super) fn forget_commands(self) -> Vec<Cmd> {
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

    const UP: ServiceState = ServiceState {
        running: true,
        enabled: true,
        stale: false,
    };

    fn changes(service_file: bool, config: bool, restart: bool) -> Changes {
        Changes {
            service_file,
            config,
            restart,
        }
    }

    #[test]
    fn systemd_does_only_what_the_change_needs() {
        let m = Manager::Systemd;
        let fresh = ServiceState::default();
        assert_eq!(
            argvs(&m.install_commands(fresh, changes(true, true, true), true)),
            [
                "systemctl daemon-reload",
                "systemctl enable railgrid-agent.service",
                "systemctl reset-failed railgrid-agent.service",
                "systemctl start railgrid-agent.service"
            ]
        );
        assert!(m
            .install_commands(UP, changes(false, false, false), true)
            .is_empty());
        assert_eq!(
            argvs(&m.install_commands(UP, changes(false, true, false), true)),
            ["systemctl reload railgrid-agent.service"]
        );
        assert_eq!(
            argvs(&m.install_commands(UP, changes(true, true, false), true)),
            [
                "systemctl daemon-reload",
                "systemctl reset-failed railgrid-agent.service",
                "systemctl restart railgrid-agent.service"
            ]
        );
        assert_eq!(
            argvs(&m.install_commands(fresh, changes(true, false, false), false)),
            [
                "systemctl daemon-reload",
                "systemctl enable railgrid-agent.service"
            ],
            "--no-start enables for the next boot only"
        );
    }

    #[test]
    fn a_new_binary_stops_the_running_agent_first_and_starts_it_after() {
        let m = Manager::Systemd;
        let c = changes(false, false, true);
        assert_eq!(
            argvs(&m.stop_first(UP, c)),
            ["systemctl stop railgrid-agent.service"]
        );
        assert_eq!(
            argvs(&m.install_commands(UP, c, true)),
            [
                "systemctl reset-failed railgrid-agent.service",
                "systemctl start railgrid-agent.service"
            ]
        );
        assert_eq!(
            argvs(&m.install_commands(UP, c, false)),
            [
                "systemctl reset-failed railgrid-agent.service",
                "systemctl start railgrid-agent.service"
            ],
            "--no-start does not leave a running agent stopped"
        );
        let stale = ServiceState { stale: true, ..UP };
        assert_eq!(
            argvs(&m.install_commands(stale, changes(false, false, false), true)),
            [
                "systemctl daemon-reload",
                "systemctl reset-failed railgrid-agent.service",
                "systemctl restart railgrid-agent.service"
            ],
            "an earlier run that stopped before daemon-reload is finished"
        );
    }

    #[test]
    fn launchd_reloads_a_changed_plist() {
        let m = Manager::Launchd;
        assert_eq!(
            argvs(&m.install_commands(UP, changes(true, false, false), true)),
            [
                "launchctl bootout system/com.railgrid.agent",
                "launchctl enable system/com.railgrid.agent",
                "launchctl bootstrap system /Library/LaunchDaemons/com.railgrid.agent.plist"
            ]
        );
        assert_eq!(
            argvs(&m.install_commands(UP, changes(false, true, false), true)),
            ["launchctl kill HUP system/com.railgrid.agent"]
        );
        assert!(m
            .install_commands(UP, changes(false, false, false), true)
            .is_empty());
        assert!(
            m.install_commands(UP, changes(true, false, false), false)
                .is_empty(),
            "--no-start leaves the running job alone; the plist is read at the next boot"
        );
    }

    #[test]
    fn uninstall_stops_the_watcher_too() {
        let cmds = Manager::Systemd.stop_commands(ServiceState::default(), true);
        assert_eq!(
            argvs(&cmds),
            [
                "systemctl stop railgrid-upgrade-watch-*",
                "systemctl disable --now railgrid-agent.service"
            ]
        );
        assert!(cmds[0].may_fail && !cmds[1].may_fail);
    }
}
