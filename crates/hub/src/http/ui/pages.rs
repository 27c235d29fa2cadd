//! The dashboard's pages, rendered on the hub as HTML: every value from the fleet goes
//! through [`esc`], and the pages carry no script of their own (the one script is
//! `/ui/assets/app.js`, for a job's live output).

use std::fmt::Write as _;

use crate::proto::fleet_job::HubJobView;
use crate::proto::hub::{AgentView, ReleaseView};
use crate::proto::rollout::RolloutView;

/// `s` safe in HTML text and in a quoted attribute.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// A path segment for a link.
fn seg(s: &str) -> String {
    esc(&crate::util::percent_encode(s))
}

fn ago(unix_s: Option<u64>) -> String {
    let Some(t) = unix_s else {
        return "never".into();
    };
    let secs = crate::util::unix_now().saturating_sub(t);
    format!(
        "{} ago",
        humantime::format_duration(std::time::Duration::from_secs(secs))
    )
}

/// The page around `body`: `here` marks the section in the menu; `csrf` the logout's.
pub(super) fn layout(title: &str, here: &str, csrf: &str, refresh: bool, body: &str) -> String {
    let mut nav = String::new();
    for (href, name) in [
        ("/ui/", "Fleet"),
        ("/ui/jobs", "Jobs"),
        ("/ui/releases", "Releases"),
        ("/ui/rollouts", "Rollouts"),
    ] {
        let class = if name == here { " class=\"here\"" } else { "" };
        let _ = write!(nav, "<a href=\"{href}\"{class}>{name}</a>");
    }
    let refresh = if refresh {
        "<meta http-equiv=\"refresh\" content=\"2\">"
    } else {
        ""
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">{refresh}<title>{title} · railgrid</title><link rel=\"stylesheet\" href=\"/ui/assets/style.css\"></head><body><header><span class=\"brand\">railgrid</span>{nav}<form method=\"post\" action=\"/ui/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button type=\"submit\" id=\"logout\">Log out</button></form></header><main>{body}</main><script src=\"/ui/assets/app.js\"></script></body></html>\n",
        title = esc(title),
        csrf = esc(csrf),
    )
}

/// The login form, carrying `csrf` (the value of the login cookie set with it).
pub(super) fn login(error: Option<&str>, csrf: &str) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\" id=\"error\">{}</p>", esc(e)))
        .unwrap_or_default();
    let csrf = esc(csrf);
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Log in · railgrid</title><link rel=\"stylesheet\" href=\"/ui/assets/style.css\"></head><body><form class=\"login\" method=\"post\" action=\"/ui/login\"><h1>railgrid</h1><p>A hub token with <code>agents:read</code> or <code>jobs:read</code>; the session lasts 8 hours, or until you log out.</p>{error}<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><label>Token<input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" required></label><button type=\"submit\" id=\"login\">Log in</button></form></body></html>\n"
    )
}

/// A page a session may not see.
pub(super) fn forbidden(what: &str) -> String {
    format!(
        "<h1>Not for this token</h1><p class=\"error\">{}</p>",
        esc(what)
    )
}

fn labels(l: &crate::proto::labels::Labels) -> String {
    l.iter()
        .filter(|(k, _)| !crate::proto::labels::AUTOMATIC.contains(&k.as_str()))
        .map(|(k, v)| format!("<span class=\"label\">{}={}</span>", esc(k), esc(v)))
        .collect()
}

pub(super) fn fleet(agents: &[AgentView]) -> String {
    let now_ms = crate::util::unix_now_ms();
    let connected = agents.iter().filter(|a| a.connected && !a.revoked).count();
    let draining = agents
        .iter()
        .filter(|a| a.drain_summary(now_ms).is_some())
        .count();
    let mut out = format!(
        "<h1>Fleet</h1><div class=\"cards\"><div class=\"card\"><b id=\"agents\">{}</b>agents</div><div class=\"card\"><b>{connected}</b>connected</div><div class=\"card\"><b>{draining}</b>draining</div></div>",
        agents.iter().filter(|a| !a.revoked).count()
    );
    out.push_str("<table id=\"fleet\"><tr><th>Agent</th><th>Connected</th><th>Version</th><th>Platform</th><th>Runner</th><th>Jobs</th><th>Labels</th><th>Last seen</th></tr>");
    for a in agents.iter().filter(|a| !a.revoked) {
        let r = a.report.as_ref();
        let runner = r.map_or("-", |r| r.runner.state.as_str());
        let runner = match a.drain_summary(now_ms) {
            Some(d) => format!("{} <span class=\"warn\">{}</span>", esc(runner), esc(&d)),
            None => esc(runner),
        };
        let jobs = r.and_then(|r| r.jobs_summary).map_or_else(
            || "-".into(),
            |j| format!("{} running, {} queued", j.running, j.queued),
        );
        let _ = write!(
            out,
            "<tr data-agent=\"{id}\"><td><b>{id}</b></td><td class=\"{cls}\">{conn}</td><td>{version}</td><td>{os}/{arch}</td><td>{runner}</td><td>{jobs}</td><td>{labels}</td><td class=\"muted\">{seen}</td></tr>",
            id = esc(&a.id),
            cls = if a.connected { "ok" } else { "bad" },
            conn = if a.connected { "yes" } else { "no" },
            version = esc(r.map_or("-", |r| r.version.as_str())),
            os = esc(r.map_or("-", |r| r.os.as_str())),
            arch = esc(r.map_or("-", |r| r.arch.as_str())),
            labels = labels(&a.labels),
            seen = ago(a.last_seen),
        );
    }
    out.push_str("</table>");
    out
}

pub(super) fn jobs(jobs: &[HubJobView]) -> String {
    let queued: Vec<&HubJobView> = jobs
        .iter()
        .filter(|j| j.agent.is_empty() && !j.done)
        .collect();
    let mut out = format!(
        "<h1>Jobs</h1><div class=\"cards\"><div class=\"card\"><b>{}</b>queued</div><div class=\"card\"><b>{}</b>running</div></div>",
        queued.len(),
        jobs.iter().filter(|j| j.state == "running").count()
    );
    if !queued.is_empty() {
        out.push_str("<h2>The fleet's queue</h2><table id=\"queue\"><tr><th>Job</th><th>Selector</th><th>Priority</th><th>Waiting</th></tr>");
        for j in &queued {
            let _ = write!(
                out,
                "<tr><td><a href=\"/ui/jobs/{}\">{}</a></td><td>{}</td><td>{}</td><td class=\"muted\">{}</td></tr>",
                seg(&j.id),
                esc(&j.id),
                esc(j.selector.as_deref().unwrap_or("")),
                j.priority,
                esc(j.waiting.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    out.push_str("<h2>Latest</h2><table id=\"jobs\"><tr><th>Job</th><th>Agent</th><th>State</th><th>Exit</th><th>Created</th><th>Command</th></tr>");
    for j in jobs {
        let cls = match j.state.as_str() {
            "succeeded" => "ok",
            "failed" | "lost" | "rejected" | "timed_out" | "expired" => "bad",
            _ => "",
        };
        let _ = write!(
            out,
            "<tr><td><a href=\"/ui/jobs/{}\">{}</a></td><td>{}</td><td class=\"{cls}\">{}</td><td>{}</td><td class=\"muted\">{}</td><td><code>{}</code></td></tr>",
            seg(&j.id),
            esc(&j.id),
            esc(&j.agent),
            esc(&j.state),
            j.exit_code.map_or_else(String::new, |c| c.to_string()),
            crate::util::rfc3339_ms(Some(j.created_ms)),
            esc(&crate::util::clip_to(&crate::util::shell_words(&j.spec.argv), 120))
        );
    }
    out.push_str("</table>");
    out
}

/// A job, its two streams growing on the page while it runs.
pub(super) fn job(j: &HubJobView) -> String {
    let id = seg(&j.id);
    format!(
        "<h1>Job {name}</h1><table><tr><th>State</th><td id=\"state\" data-refresh=\"{refresh}\">{state}{exit}</td></tr><tr><th>Agent</th><td>{agent}</td></tr><tr><th>Selector</th><td>{selector}</td></tr><tr><th>Command</th><td><code>{argv}</code></td></tr><tr><th>Created</th><td>{created}</td></tr><tr><th>Started</th><td>{started}</td></tr><tr><th>Finished</th><td>{finished}</td></tr><tr><th>Error</th><td>{error}</td></tr><tr><th>Network</th><td>{network}</td></tr></table>{denied}<h2>stdout</h2><pre id=\"stdout\" data-stream=\"/ui/jobs/{id}/output/stdout\"></pre><h2>stderr</h2><pre id=\"stderr\" class=\"err\" data-stream=\"/ui/jobs/{id}/output/stderr\"></pre>",
        name = esc(&j.id),
        refresh = !j.done,
        state = esc(&j.state),
        exit = j.exit_code.map_or_else(String::new, |c| format!(", exit code {c}")),
        agent = esc(&j.agent),
        selector = esc(j.selector.as_deref().unwrap_or("-")),
        argv = esc(&crate::util::shell_words(&j.spec.argv)),
        created = crate::util::rfc3339_ms(Some(j.created_ms)),
        started = crate::util::rfc3339_ms(j.started_ms),
        finished = crate::util::rfc3339_ms(j.finished_ms),
        error = esc(j.error.as_deref().unwrap_or("")),
        network = esc(&j
            .spec
            .network
            .as_ref()
            .map_or_else(|| "the runner's policy".to_owned(), |n| n.to_string())),
        denied = egress_denied(&j.egress_denied),
    )
}

/// What the job's egress proxy refused, as a table (nothing when it refused nothing).
fn egress_denied(denied: &[crate::proto::egress::Denial]) -> String {
    if denied.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Egress denied</h2><table id=\"egress-denied\"><tr><th>Destination</th><th>Count</th><th>Why</th></tr>",
    );
    for d in denied {
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            esc(&d.destination),
            d.count,
            esc(&d.reason)
        );
    }
    out.push_str("</table>");
    out
}

pub(super) fn releases(all: &[ReleaseView]) -> String {
    let mut out = String::from("<h1>Releases</h1><table id=\"releases\"><tr><th>Version</th><th>Platforms</th><th>Agents</th><th>Pending</th><th>State</th></tr>");
    for r in all {
        let platforms: Vec<String> = r
            .artifacts
            .iter()
            .map(|a| format!("{}-{}", esc(&a.os), esc(&a.arch)))
            .collect();
        let state = match &r.halted {
            Some(h) => format!(
                "<span class=\"bad\">halted: rolled back by {}: {}</span>",
                esc(&h.agent),
                esc(&h.reason)
            ),
            None => "<span class=\"ok\">offered</span>".into(),
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{state}</td></tr>",
            esc(&r.version),
            platforms.join(", "),
            r.agents,
            r.pending
        );
    }
    out.push_str("</table>");
    out
}

pub(super) fn rollouts(all: &[RolloutView]) -> String {
    let mut out = String::from("<h1>Rollouts</h1><table id=\"rollouts\"><tr><th>Rollout</th><th>Version</th><th>State</th><th>Wave</th><th>Committed</th><th>Started</th></tr>");
    for r in all.iter().rev() {
        let total: usize = r.counts.values().sum();
        let _ = write!(
            out,
            "<tr><td><a href=\"/ui/rollouts/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}/{total}</td><td class=\"muted\">{}</td></tr>",
            seg(&r.id),
            esc(&r.id),
            esc(&r.version),
            esc(&r.state),
            r.wave + 1,
            r.counts.get("committed").copied().unwrap_or(0),
            crate::util::rfc3339_ms(Some(r.created_ms))
        );
    }
    out.push_str("</table>");
    out
}

/// A rollout wave by wave; the page reloads itself while the rollout goes on.
pub(super) fn rollout(r: &RolloutView) -> String {
    let mut out = format!(
        "<h1>Rollout {} of {}</h1><p>State: <b id=\"rollout-state\">{}</b>{}</p>",
        esc(&r.id),
        esc(&r.version),
        esc(&r.state),
        r.waiting
            .as_deref()
            .or(r.reason.as_deref())
            .map(|w| format!(" <span class=\"muted\">{}</span>", esc(w)))
            .unwrap_or_default()
    );
    for w in &r.waves {
        let _ = write!(
            out,
            "<h2>Wave {} <span class=\"muted\">{}</span></h2><table class=\"wave\"><tr><th>Agent</th><th>State</th><th>From</th><th>Now</th><th>Detail</th></tr>",
            w.index + 1,
            esc(&w.state)
        );
        for m in &w.members {
            let cls = match m.state.as_str() {
                "committed" | "reverted" => "ok",
                "rolled_back" | "failed" => "bad",
                "draining" | "switching" | "reverting" => "warn",
                _ => "muted",
            };
            let _ = write!(
                out,
                "<tr data-member=\"{agent}\"><td>{agent}</td><td class=\"{cls}\">{state}</td><td>{from}</td><td>{now}</td><td class=\"muted\">{detail}</td></tr>",
                agent = esc(&m.agent),
                state = esc(&m.state),
                from = esc(m.from_version.as_deref().unwrap_or("-")),
                now = esc(m.version.as_deref().unwrap_or("-")),
                detail = esc(m.detail.as_deref().unwrap_or("")),
            );
        }
        out.push_str("</table>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_the_fleet_cannot_become_markup() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\u{1b}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;?"
        );
    }

    #[test]
    fn a_jobs_page_lists_what_its_proxy_refused_as_text() {
        let mut j: HubJobView = serde_json::from_value(serde_json::json!({
            "id": "j1", "agent": "a1", "spec": {"argv": ["true"], "network": "allow a.example:443"},
            "state": "succeeded", "created_ms": 0,
        }))
        .expect("a view");
        assert!(!job(&j).contains("Egress denied"));
        j.egress_denied = vec![crate::proto::egress::Denial {
            destination: "<b>evil</b>:443".into(),
            reason: "no rule allows evil on port 443".into(),
            count: 3,
        }];
        let page = job(&j);
        assert!(page.contains("<td>allow a.example:443</td>"), "{page}");
        assert!(
            page.contains("<tr><td><code>&lt;b&gt;evil&lt;/b&gt;:443</code></td><td>3</td><td>no rule allows evil on port 443</td></tr>"),
            "{page}"
        );
    }
}
