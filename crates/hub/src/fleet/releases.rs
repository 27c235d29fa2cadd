//! Published releases and halted versions, in memory with the fleet: what turns an
//! agent's desired version into an artifact it can fetch, and what keeps a version that
//! rolled back on one host from reaching the others.
//!
//! A version is halted as soon as any agent reports `rolled_back` for it. A halted
//! version is still sent to agents that have started it (they report it as their version
//! or as their upgrade's target), so that none is left half-way; every other agent is
//! sent no version at all, and keeps the one it runs, until `hub release resume`.

use std::collections::{BTreeMap, HashMap};

use crate::proto::desired::{Artifact, DesiredAgent};
use crate::proto::hub::{Halt, ReleaseArtifact, ReleaseView};
use crate::proto::report::AgentReport;

use super::super::store::{HaltRow, ReleaseRow};

/// The upgrade state an agent reports once a new version runs but is not committed.
pub(super) const PENDING_COMMIT: &str = "pending_commit";
/// The upgrade state of an agent whose watcher restored its previous binary.
pub const ROLLED_BACK: &str = "rolled_back";

#[derive(Debug, Default)]
pub(super) struct Releases {
    /// By (version, os, arch).
    artifacts: HashMap<(String, String, String), ReleaseRow>,
    halts: HashMap<String, HaltRow>,
}

impl Releases {
    pub(super) fn load(rows: Vec<ReleaseRow>, halts: Vec<HaltRow>) -> Self {
        Self {
            artifacts: rows
                .into_iter()
                .map(|r| ((r.version.clone(), r.os.clone(), r.arch.clone()), r))
                .collect(),
            halts: halts.into_iter().map(|h| (h.version.clone(), h)).collect(),
        }
    }

    pub(super) fn put(&mut self, row: ReleaseRow) {
        self.artifacts
            .insert((row.version.clone(), row.os.clone(), row.arch.clone()), row);
    }

    pub(super) fn get(&self, version: &str, os: &str, arch: &str) -> Option<&ReleaseRow> {
        self.artifacts
            .get(&(version.to_owned(), os.to_owned(), arch.to_owned()))
    }

    pub(super) fn has_version(&self, version: &str) -> bool {
        self.artifacts.keys().any(|(v, _, _)| v == version)
    }

    pub(super) fn halt(&mut self, row: HaltRow) {
        self.halts.insert(row.version.clone(), row);
    }

    pub(super) fn resume(&mut self, version: &str) -> bool {
        self.halts.remove(version).is_some()
    }

    pub(super) fn is_halted(&self, version: &str) -> bool {
        self.halts.contains_key(version)
    }

    /// Why `version` is halted, in words, if it is.
    pub(super) fn halt_of(&self, version: &str) -> Option<String> {
        self.halts
            .get(version)
            .map(|h| format!("{version} rolled back on {}: {}", h.agent, h.reason))
    }

    /// What an agent whose settings ask for `version` is sent, given its latest report
    /// (its platform, what it runs, what it is upgrading to).
    pub(super) fn desired_agent(
        &self,
        agent: &str,
        version: String,
        rollback: bool,
        report: Option<&AgentReport>,
    ) -> Option<DesiredAgent> {
        // Started: it runs the version, or is past the point of no return (its binary
        // switched). A download that failed, or a refusal, has not started it.
        let started = report.is_some_and(|r| {
            r.version == version
                || r.upgrade.as_ref().is_some_and(|u| {
                    u.target.as_deref() == Some(version.as_str())
                        && matches!(u.state.as_str(), "switching" | PENDING_COMMIT | "committed")
                })
        });
        if self.is_halted(&version) && !started {
            return None;
        }
        let artifact = report
            .and_then(|r| self.get(&version, &r.os, &r.arch))
            .map(|row| Artifact {
                url: format!(
                    "/v1/releases/{}/{}-{}?agent={agent}",
                    row.version, row.os, row.arch
                ),
                sha256: row.sha256.clone(),
                size: row.size,
                signature: row.signature.clone(),
            });
        Some(DesiredAgent {
            version,
            artifact,
            rollback,
        })
    }

    /// Every version, newest publication last, with how many of `reports` run it.
    pub(super) fn views<'a>(
        &self,
        reports: impl Iterator<Item = &'a AgentReport>,
    ) -> Vec<ReleaseView> {
        let mut running: HashMap<&str, (u64, u64)> = HashMap::new();
        for r in reports {
            let pending = r
                .upgrade
                .as_ref()
                .is_some_and(|u| u.state == PENDING_COMMIT);
            let n = running.entry(r.version.as_str()).or_default();
            if pending {
                n.1 += 1;
            } else {
                n.0 += 1;
            }
        }
        let mut by_version: BTreeMap<&str, Vec<&ReleaseRow>> = BTreeMap::new();
        for row in self.artifacts.values() {
            by_version
                .entry(row.version.as_str())
                .or_default()
                .push(row);
        }
        // A halted version nobody published (an operator's own binary, rolled back on
        // a host) is shown too: the fleet is told of it all the same.
        for v in self.halts.keys() {
            by_version.entry(v.as_str()).or_default();
        }
        let mut views: Vec<ReleaseView> = by_version
            .into_iter()
            .map(|(version, mut rows)| {
                rows.sort_by(|a, b| (&a.os, &a.arch).cmp(&(&b.os, &b.arch)));
                let (agents, pending) = running.get(version).copied().unwrap_or_default();
                ReleaseView {
                    version: version.to_owned(),
                    artifacts: rows
                        .iter()
                        .map(|r| ReleaseArtifact {
                            os: r.os.clone(),
                            arch: r.arch.clone(),
                            size: r.size,
                            sha256: r.sha256.clone(),
                            key_id: r.key_id.clone(),
                            published_at: r.published_at,
                        })
                        .collect(),
                    agents,
                    pending,
                    halted: self.halts.get(version).map(|h| Halt {
                        agent: h.agent.clone(),
                        reason: h.reason.clone(),
                        at: h.halted_at,
                    }),
                }
            })
            .collect();
        views.sort_by_key(|v| {
            v.artifacts
                .iter()
                .map(|a| a.published_at)
                .max()
                .or_else(|| v.halted.as_ref().map(|h| h.at))
                .unwrap_or_default()
        });
        views
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::report::UpgradeReport;

    fn row(version: &str) -> ReleaseRow {
        ReleaseRow {
            version: version.into(),
            os: "linux".into(),
            arch: "x86_64".into(),
            size: 10,
            sha256: "ab".into(),
            signature: "sig".into(),
            key_id: "k".into(),
            published_at: 1,
        }
    }

    fn report(version: &str, upgrade: Option<(&str, &str)>) -> AgentReport {
        AgentReport {
            version: version.into(),
            os: "linux".into(),
            arch: "x86_64".into(),
            hostname: String::new(),
            labels: Default::default(),
            observed_generation: 0,
            runner: Default::default(),
            upgrade: upgrade.map(|(state, target)| UpgradeReport::toward(state, target, None)),
            jobs_summary: None,
            drain: None,
            jobs: Vec::new(),
            jobs_version: None,
            refused_generation: None,
        }
    }

    #[test]
    fn a_halted_version_reaches_only_the_agents_that_started_it() {
        let mut r = Releases::default();
        r.put(row("2.0.0"));
        let idle = report("1.0.0", None);
        let d = r
            .desired_agent("a", "2.0.0".into(), false, Some(&idle))
            .expect("offered");
        let art = d.artifact.expect("artifact for linux-x86_64");
        assert_eq!(art.url, "/v1/releases/2.0.0/linux-x86_64?agent=a");
        assert_eq!(art.size, 10);

        r.halt(HaltRow {
            version: "2.0.0".into(),
            agent: "b".into(),
            reason: "crashed".into(),
            halted_at: 5,
        });
        assert_eq!(
            r.desired_agent("a", "2.0.0".into(), false, Some(&idle)),
            None
        );
        let downloading = report("1.0.0", Some(("downloading", "2.0.0")));
        assert_eq!(
            r.desired_agent("c", "2.0.0".into(), false, Some(&downloading)),
            None,
            "a download is no start"
        );
        let switching = report("1.0.0", Some(("switching", "2.0.0")));
        assert!(r
            .desired_agent("c", "2.0.0".into(), false, Some(&switching))
            .is_some());
        let rolled = report("1.0.0", Some((ROLLED_BACK, "2.0.0")));
        assert_eq!(
            r.desired_agent("b", "2.0.0".into(), false, Some(&rolled)),
            None
        );
        let running = report("2.0.0", Some((PENDING_COMMIT, "2.0.0")));
        assert!(r
            .desired_agent("d", "2.0.0".into(), false, Some(&running))
            .is_some());

        let views = r.views([idle, running].iter());
        assert_eq!(views.len(), 1);
        assert_eq!((views[0].agents, views[0].pending), (0, 1));
        assert_eq!(
            views[0].halted.as_ref().map(|h| h.agent.as_str()),
            Some("b")
        );
        assert!(r.resume("2.0.0"));
        assert!(!r.is_halted("2.0.0"));
    }

    #[test]
    fn no_artifact_for_another_platform() {
        let mut r = Releases::default();
        r.put(row("2.0.0"));
        let mut mac = report("1.0.0", None);
        mac.os = "macos".into();
        let d = r
            .desired_agent("a", "2.0.0".into(), false, Some(&mac))
            .expect("still the version");
        assert_eq!(d.artifact, None);
    }
}
