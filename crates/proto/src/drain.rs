//! A drain: a host that takes no new job while the jobs it has finish (docs/design.md,
//! "Drain"). The same value travels from wherever a drain is asked for (the hub's desired
//! state, `railgrid agent drain` on the host, an upgrade waiting to switch) to the runner,
//! which refuses new jobs under it and cancels what is left at its deadline.

use serde::{Deserialize, Serialize};

/// The longest reason a drain carries, in bytes: it is shown in errors and listings.
pub const MAX_REASON: usize = 256;

/// What a drain the hub asked for says of itself (`hub agent drain`).
pub const HUB_REASON: &str = "drained by the hub";

/// A drain in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// Why, as every refused submission and every job cancelled at the deadline says it
    /// (`drained by the hub`, `upgrade to 1.4.0`, …).
    pub reason: String,
    /// When it began (Unix ms).
    #[serde(default)]
    pub since_ms: u64,
    /// When what still runs is cancelled (Unix ms); `None`: running jobs are waited for,
    /// however long they take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
}

impl Drain {
    /// Checks what the types cannot: a reason that fits a log line.
    pub fn check(&self) -> Result<(), String> {
        if self.reason.is_empty() || self.reason.len() > MAX_REASON {
            return Err(format!(
                "a drain's reason must be 1 to {MAX_REASON} bytes, not {}",
                self.reason.len()
            ));
        }
        if self.reason.chars().any(char::is_control) {
            return Err("a drain's reason must not hold control characters".into());
        }
        Ok(())
    }

    /// True once the deadline has passed at `now_ms`.
    pub fn past_deadline(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|d| now_ms >= d)
    }
}

/// `GET|PUT|DELETE /v1/drain` on the runner: the drain in force, and the jobs it waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
    /// Jobs starting or running.
    #[serde(default)]
    pub running: u64,
    /// Jobs admitted and waiting for a slot.
    #[serde(default)]
    pub queued: u64,
}

impl DrainView {
    /// The jobs a drain still waits for.
    pub fn jobs_left(&self) -> u64 {
        self.running + self.queued
    }
}

/// What the agent tells its hub of a drain in force on the host (in each report), and
/// what `agent status` shows.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReport {
    /// Every reason in force, joined (`drained on the host; upgrade to 1.4.0`).
    pub reason: String,
    #[serde(default)]
    pub since_ms: u64,
    pub deadline_ms: Option<u64>,
    /// Jobs the runner still holds (running and queued); `None` when it could not be asked.
    pub jobs_left: Option<u64>,
    /// True when the drain came from the host (`railgrid agent drain`): only the host
    /// ends it.
    #[serde(default)]
    pub host: bool,
}

impl DrainReport {
    /// True once the deadline has passed at `now_ms`.
    pub fn past_deadline(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|d| now_ms >= d)
    }

    /// `draining (2 jobs left, deadline in 4m 59s)`, as listings show it (the reason apart).
    pub fn summary(&self, now_ms: u64) -> String {
        let left = match self.jobs_left {
            Some(1) => "1 job left".to_owned(),
            Some(n) => format!("{n} jobs left"),
            None => "jobs left unknown".to_owned(),
        };
        let deadline = match self.deadline_ms {
            Some(d) if d > now_ms => {
                let secs = (d - now_ms).div_ceil(1000);
                format!(
                    ", deadline in {}",
                    humantime::format_duration(std::time::Duration::from_secs(secs))
                )
            }
            Some(_) => ", deadline passed".to_owned(),
            None => String::new(),
        };
        format!("draining ({left}{deadline})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_that_could_forge_a_log_line_is_refused() {
        let d = |reason: &str| Drain {
            reason: reason.into(),
            since_ms: 1,
            deadline_ms: None,
        };
        assert!(d("upgrade to 1.4.0").check().is_ok());
        assert!(d("").check().is_err());
        assert!(d("a\nb").check().is_err());
        assert!(d(&"x".repeat(MAX_REASON + 1)).check().is_err());
        let past = Drain {
            deadline_ms: Some(10),
            ..d("x")
        };
        assert!(past.past_deadline(10) && !past.past_deadline(9));
        assert!(!d("x").past_deadline(u64::MAX));
    }

    #[test]
    fn a_summary_says_what_is_left_and_when_it_ends() {
        let r = DrainReport {
            reason: "x".into(),
            since_ms: 0,
            deadline_ms: Some(61_000),
            jobs_left: Some(1),
            host: false,
        };
        assert_eq!(r.summary(1_000), "draining (1 job left, deadline in 1m)");
        assert_eq!(r.summary(61_000), "draining (1 job left, deadline passed)");
        let r = DrainReport {
            deadline_ms: None,
            jobs_left: None,
            ..r
        };
        assert_eq!(r.summary(0), "draining (jobs left unknown)");
    }
}
