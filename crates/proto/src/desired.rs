//! The desired state of one agent: what the hub answers to a reconcile (hub protocol v1,
//! docs/hub.md), and what a standalone agent derives from its config file. The agent's
//! reconciler converges to it, whichever of the two it came from.
//!
//! Only what the hub may decide is here. What the host alone can decide (the runner's
//! account, its stop grace and backoff, its log cap, cgroup delegation, the jobs' PATH)
//! stays in the agent's config file.

use serde::{Deserialize, Serialize};

pub use super::fleet_job::DesiredJob;

/// The largest generation a hub hands out and an agent takes: generations stay exact as
/// JSON numbers (2^53) and far from the signed 64-bit columns a hub keeps them in. The
/// reference hub refuses a report beyond it; an agent refuses a desired state beyond it,
/// which it would otherwise keep, and then refuse every real answer as older.
pub const MAX_GENERATION: u64 = 1 << 53;
/// The longest agent version (the hub's rule).
const MAX_VERSION_LEN: usize = 64;

/// Why a desired state cannot be taken, though it parses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("generation {0} is beyond any a hub hands out (at most {MAX_GENERATION})")]
    Generation(u64),
    // Without the text: it came from the hub, and only the hub's own rule makes it safe
    // to show.
    #[error("the agent version it asks for is not a version (1 to 64 of A-Z a-z 0-9 . + - _)")]
    AgentVersion,
    // Without the text, for the same reason: a newline in it would forge a log line.
    #[error("the release's URL is not a URL (1 to 2048 visible ASCII characters)")]
    ArtifactUrl,
    #[error("the release's SHA-256 is not 64 lowercase hex digits")]
    ArtifactSha256,
}

/// The longest artifact URL an agent takes.
const MAX_URL_LEN: usize = 2048;

/// True for an agent version as the hub accepts one (such as `1.4.0` or `1.5.0-rc.1`).
pub fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_VERSION_LEN
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+-_".contains(&b))
}

/// The response body of `POST /v1/agents/{id}/reconcile`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    /// Bumped by every change; the agent reports the one it applied as
    /// `observed_generation`, and never goes back to an older one.
    #[serde(default)]
    pub generation: u64,
    /// How long the agent waits between reconciles when the hub asks for no long poll.
    pub poll_interval_secs: Option<u64>,
    /// The agent version the hub wants here; `None` keeps whatever runs. Acted on by the
    /// self-upgrade; until then only reported.
    pub agent: Option<DesiredAgent>,
    #[serde(default)]
    pub runner: DesiredRunner,
    /// The hub's jobs for this host that are not over yet: the agent starts those that
    /// come with a spec, follows all of them, and uploads their output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<DesiredJob>,
    /// Ids of jobs to cancel (the runner's cancel: group, grace, kill).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancel_jobs: Vec<String>,
    /// Names the `jobs` and `cancel_jobs` of this answer, apart from the generation
    /// (jobs never move it: a job is not a setting). The agent echoes it in its reports
    /// as `jobs_version`; it grows whenever what the hub sends of the jobs changes, and
    /// a poll whose echo is behind is answered at once. Every replica gives the same
    /// jobs the same version.
    pub jobs_version: Option<u64>,
    /// False while the hub drains this agent: the host takes no new job (the runner
    /// refuses them) and its running jobs finish (docs/design.md, "Drain").
    #[serde(default = "enabled_by_default", skip_serializing_if = "is_true")]
    pub accept_jobs: bool,
    /// When a drain cancels what still runs (Unix ms, the hub's clock); `None`: never.
    pub drain_deadline_ms: Option<u64>,
    /// A new token for this agent (a rotation): stored before it is used, and taken out
    /// of the state before anything keeps or shows it.
    pub new_token: Option<NewToken>,
}

/// An agent token on its way to the agent: never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NewToken(pub String);

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Default for DesiredState {
    fn default() -> Self {
        Self {
            generation: 0,
            poll_interval_secs: None,
            agent: None,
            runner: DesiredRunner::default(),
            jobs: Vec::new(),
            cancel_jobs: Vec::new(),
            jobs_version: None,
            accept_jobs: true,
            drain_deadline_ms: None,
            new_token: None,
        }
    }
}

fn is_true(b: &bool) -> bool {
    *b
}

impl DesiredState {
    /// Checks what the types cannot: the generation's bound and the agent version's form.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.generation > MAX_GENERATION {
            return Err(Invalid::Generation(self.generation));
        }
        if let Some(agent) = &self.agent {
            if !is_version(&agent.version) {
                return Err(Invalid::AgentVersion);
            }
            if let Some(art) = &agent.artifact {
                let url = &art.url;
                if url.is_empty()
                    || url.len() > MAX_URL_LEN
                    || !url.bytes().all(|b| b.is_ascii_graphic())
                {
                    return Err(Invalid::ArtifactUrl);
                }
                let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                if art.sha256.len() != 64 || !art.sha256.bytes().all(hex) {
                    return Err(Invalid::ArtifactSha256);
                }
            }
        }
        Ok(())
    }
}

/// The agent build the hub wants on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredAgent {
    pub version: String,
    /// Where to fetch it for this host's platform; `None` when the hub has no such
    /// release (the agent reports that, and keeps what runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Artifact>,
    /// True when the hub asks for an older version on purpose (a rollback), which the
    /// agent otherwise refuses as a downgrade.
    #[serde(default)]
    pub rollback: bool,
}

/// A release binary as the agent downloads it. Nothing here is trusted for itself: the
/// bytes must hash to `sha256`, stay within `size`, and carry a good signature by a key
/// in the agent's own configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// A path on the hub (`/v1/releases/…`), fetched with the agent's own token over the
    /// agent's own connection to its hub; nothing else is followed.
    pub url: String,
    /// Lowercase hex SHA-256 of the binary.
    pub sha256: String,
    pub size: u64,
    /// The `.minisig` file's text.
    pub signature: String,
}

/// The runner as the hub (or the config file) wants it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredRunner {
    /// False: no runner on this host (its jobs are stopped and reaped).
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// With `enabled: false`: the runner drains first (its jobs finish, none is taken),
    /// and stops once none is left; false stops it at once (its jobs get the stop budget).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain_first: bool,
    /// Job engine limits; `None` keeps the runner's own defaults.
    pub max_jobs: Option<usize>,
    pub max_jobs_per_owner: Option<usize>,
    pub max_queued: Option<usize>,
    pub max_output_bytes: Option<u64>,
    /// The network jobs reach unless they ask for less; `None` keeps the host's own
    /// (`runner.network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::job::Network>,
}

/// A desired state that says nothing of the runner still wants one: the embedded default
/// is a standalone host that runs jobs (docs/design.md, invariant 12).
fn enabled_by_default() -> bool {
    true
}

impl Default for DesiredRunner {
    fn default() -> Self {
        Self {
            enabled: true,
            drain_first: false,
            max_jobs: None,
            max_jobs_per_owner: None,
            max_queued: None,
            max_output_bytes: None,
            network: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_answer_is_the_embedded_default() {
        let d: DesiredState = serde_json::from_str("{}").expect("parse");
        assert_eq!(d, DesiredState::default());
        assert!(d.runner.enabled);
    }

    /// An agent of an older release refuses nothing it does not know, but a `null` where it
    /// expects a number is still an error somewhere: what is unset stays off the wire.
    #[test]
    fn what_is_unset_is_left_out_of_the_wire() {
        let d = DesiredState {
            runner: DesiredRunner {
                max_jobs: Some(2),
                ..DesiredRunner::default()
            },
            ..DesiredState::default()
        };
        let json = serde_json::to_string(&d).expect("serialize");
        assert!(!json.contains("null"), "{json}");
        assert!(json.contains(r#""max_jobs":2"#), "{json}");
        assert!(!json.contains("poll_interval_secs"), "{json}");
        assert_eq!(
            serde_json::from_str::<DesiredState>(&json).expect("parse"),
            d
        );
    }

    #[test]
    fn unknown_fields_are_ignored_and_known_ones_kept() {
        let d: DesiredState = serde_json::from_str(
            r#"{"generation": 7, "agent": null, "jobs": [], "cancel_jobs": [],
                "runner": {"enabled": false, "max_jobs": 3, "future": 1}}"#,
        )
        .expect("parse");
        assert_eq!(d.generation, 7);
        assert!(!d.runner.enabled);
        assert_eq!(d.runner.max_jobs, Some(3));
        assert_eq!(d.runner.max_jobs_per_owner, None);
    }

    #[test]
    fn an_artifact_url_that_could_forge_a_log_line_is_refused() {
        let with = |url: &str, sha256: &str| DesiredState {
            agent: Some(DesiredAgent {
                version: "1.2.0".into(),
                artifact: Some(Artifact {
                    url: url.into(),
                    sha256: sha256.into(),
                    size: 1,
                    signature: String::new(),
                }),
                rollback: false,
            }),
            ..DesiredState::default()
        };
        let sha = "a".repeat(64);
        assert_eq!(
            with("/v1/releases/1.2.0/linux-x86_64", &sha).check(),
            Ok(())
        );
        for bad in [
            "/x\n2026-12-02T00:00:00Z  INFO forged",
            "/a b",
            "",
            &"/".repeat(2049),
        ] {
            assert_eq!(
                with(bad, &sha).check(),
                Err(Invalid::ArtifactUrl),
                "{bad:?}"
            );
        }
        for bad in [
            "A".repeat(64),
            "a".repeat(63),
            format!("{}\n", "a".repeat(63)),
        ] {
            assert_eq!(
                with("/v1", &bad).check(),
                Err(Invalid::ArtifactSha256),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_generation_is_bounded_and_the_agent_version_checked() {
        let mut d = DesiredState {
            generation: MAX_GENERATION,
            ..DesiredState::default()
        };
        assert_eq!(d.check(), Ok(()));
        d.generation = MAX_GENERATION + 1;
        assert_eq!(d.check(), Err(Invalid::Generation(MAX_GENERATION + 1)));
        let d: DesiredState =
            serde_json::from_str(r#"{"generation": 18446744073709551615}"#).expect("parse");
        assert!(d.check().is_err());

        for ok in ["1.4.0", "1.5.0-rc.1+build_7", &"9".repeat(64)] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in [
            "",
            "1.0 beta",
            "Bearer x",
            "<redacted>",
            "1/2",
            &"9".repeat(65),
        ] {
            assert!(!is_version(bad), "{bad}");
        }
        let d = DesiredState {
            agent: Some(DesiredAgent {
                version: "v\n1".into(),
                artifact: None,
                rollback: false,
            }),
            ..DesiredState::default()
        };
        assert_eq!(d.check(), Err(Invalid::AgentVersion));
        assert!(!Invalid::AgentVersion.to_string().contains("v\n1"));
    }

    #[test]
    fn it_round_trips() {
        let d = DesiredState {
            generation: 2,
            poll_interval_secs: Some(30),
            agent: Some(DesiredAgent {
                version: "1.2.3".into(),
                artifact: Some(Artifact {
                    url: "/v1/releases/1.2.3/linux-x86_64?agent=a".into(),
                    sha256: "ab".into(),
                    size: 3,
                    signature: "sig".into(),
                }),
                rollback: false,
            }),
            runner: DesiredRunner {
                enabled: true,
                drain_first: true,
                max_jobs: Some(4),
                max_jobs_per_owner: Some(2),
                max_queued: Some(10),
                max_output_bytes: Some(1 << 20),
                network: Some(crate::job::Network::None),
            },
            jobs: vec![DesiredJob {
                id: "j1".into(),
                spec: None,
                secret_values: Default::default(),
            }],
            cancel_jobs: vec!["j0".into()],
            jobs_version: Some(7),
            accept_jobs: false,
            drain_deadline_ms: Some(5),
            new_token: None,
        };
        let back: DesiredState =
            serde_json::from_str(&serde_json::to_string(&d).expect("json")).expect("parse");
        assert_eq!(back, d);
    }
}
