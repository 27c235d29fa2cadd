//! Rights never grow by delegation (docs/security.md, "Rights never grow by
//! delegation"): a token makes, or revokes, only tokens that reach no further than
//! itself, and a selected token acts only on the agents its selection matches.
//!
//! - An admin token it makes has a subset of its scopes, and a selection within its own
//!   ([`Selector::within`]): an unselected token is never made by a selected one.
//! - An enrolment token adds agents: its maker needs `agents:write`, and the hub labels
//!   it gives must match the maker's selection, so every host it enrols is one the maker
//!   reaches.
//! - Revoking a token takes the same rights as making it: a narrow token cannot switch
//!   off a wider one.

use super::Caller;
use crate::proto::access::{AGENTS_WRITE, JOBS_NETWORK};
use crate::proto::labels::Labels;
use crate::proto::selector::Selector;

/// Why a caller may not do something: said in a 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token {caller:?} {why}")]
pub struct Exceeds {
    pub caller: String,
    pub why: String,
}

impl Caller {
    fn exceeds(&self, why: String) -> Exceeds {
        Exceeds {
            caller: self.name().to_owned(),
            why,
        }
    }

    /// The hub labels an agent must match for this caller to act on it (`None`: any).
    pub fn selection(&self) -> Option<&Selector> {
        match self {
            Caller::Root => None,
            Caller::Token { selector, .. } => selector.as_ref(),
        }
    }

    /// Refuses a job asking for a network wider than its runner's policy
    /// (`widen_network`) to a caller without `jobs:network`.
    pub fn may_widen_network(&self) -> Result<(), Exceeds> {
        match self {
            Caller::Token { scopes, .. } if !scopes.iter().any(|s| s == JOBS_NETWORK) => {
                Err(self.exceeds(format!(
                    "has no scope {JOBS_NETWORK}: a job it submits may narrow its runner's network policy, never widen it (drop widen_network)"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Refuses a selected caller an action on the whole fleet.
    pub fn fleet_wide(&self, what: &str) -> Result<(), Exceeds> {
        match self.selection() {
            None => Ok(()),
            Some(sel) => Err(self.exceeds(format!(
                "reaches only agents whose hub labels match {sel}: {what} acts on the whole fleet and needs a token without a selection"
            ))),
        }
    }

    /// Refuses an action on an agent whose hub labels are `labels` (as they are, or as
    /// they would be after a change) outside this caller's selection.
    pub fn reach(&self, agent: &str, labels: &Labels) -> Result<(), Exceeds> {
        match self.selection() {
            Some(sel) if !sel.matches(labels) => Err(self.exceeds(format!(
                "reaches only agents whose hub labels match {sel}; agent {agent} does not"
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses to make (or revoke) an admin token with `scopes` and `selector`.
    pub fn may_grant(&self, scopes: &[String], selector: Option<&Selector>) -> Result<(), Exceeds> {
        let Caller::Token {
            scopes: own,
            selector: own_sel,
            ..
        } = self
        else {
            return Ok(());
        };
        let wider: Vec<&str> = scopes
            .iter()
            .filter(|s| !own.contains(s))
            .map(String::as_str)
            .collect();
        if !wider.is_empty() {
            return Err(self.exceeds(format!(
                "may give only the scopes it has ({}): {} {} not among them",
                own.join(","),
                wider.join(","),
                if wider.len() == 1 { "is" } else { "are" }
            )));
        }
        match (own_sel, selector) {
            (None, _) => Ok(()),
            (Some(own), Some(sel)) if sel.within(own) => Ok(()),
            (Some(own), Some(sel)) => Err(self.exceeds(format!(
                "reaches only agents whose hub labels match {own}: the selection {sel} reaches further (give {own} or a narrower one)"
            ))),
            (Some(own), None) => Err(self.exceeds(format!(
                "reaches only agents whose hub labels match {own}: a token it makes must select within it (--select {own}, or narrower)"
            ))),
        }
    }

    /// Refuses to make (or revoke) an enrolment token that gives its hosts `labels`.
    pub fn may_enrol(&self, labels: &Labels) -> Result<(), Exceeds> {
        if !self.may(AGENTS_WRITE) {
            return Err(self.exceeds(format!(
                "lacks the scope {AGENTS_WRITE} that adding agents (an enrolment token) needs"
            )));
        }
        match self.selection() {
            Some(sel) if !sel.matches(labels) => Err(self.exceeds(format!(
                "reaches only agents whose hub labels match {sel}: an enrolment token it makes must give labels that match it (--label …)"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::labels::parse_list;

    fn token(scopes: &str, selector: Option<&str>) -> Caller {
        Caller::Token {
            name: "t".into(),
            scopes: scopes.split(',').map(str::to_owned).collect(),
            selector: selector.map(|s| Selector::parse(s).expect("selector")),
        }
    }

    fn scopes(s: &str) -> Vec<String> {
        s.split(',').map(str::to_owned).collect()
    }

    fn sel(s: &str) -> Selector {
        Selector::parse(s).expect("selector")
    }

    #[test]
    fn a_token_grants_only_its_own_scopes_within_its_own_selection() {
        let minter = token("tokens:write,jobs:read", Some("tier=ci"));
        let ok = minter.may_grant(&scopes("jobs:read"), Some(&sel("tier=ci,queue=build")));
        assert_eq!(ok, Ok(()));
        let e = minter
            .may_grant(&scopes("jobs:read,audit:read"), Some(&sel("tier=ci")))
            .expect_err("wider scopes");
        assert!(
            e.to_string().contains("audit:read is not among them"),
            "{e}"
        );
        let e = minter
            .may_grant(&scopes("jobs:read"), None)
            .expect_err("unselected");
        assert!(e.to_string().contains("--select tier=ci"), "{e}");
        let e = minter
            .may_grant(&scopes("jobs:read"), Some(&sel("tier!=prod")))
            .expect_err("wider selection");
        assert!(e.to_string().contains("tier!=prod reaches further"), "{e}");
        assert_eq!(Caller::Root.may_grant(&scopes("audit:read"), None), Ok(()));
        let unselected = token("tokens:write,jobs:read", None);
        assert_eq!(
            unselected.may_grant(&scopes("jobs:read"), Some(&sel("a=b"))),
            Ok(())
        );
    }

    #[test]
    fn an_enrolment_token_needs_agents_write_and_labels_in_the_selection() {
        let labels = parse_list("tier=ci").expect("labels");
        let e = token("tokens:write", None)
            .may_enrol(&labels)
            .expect_err("no agents:write");
        assert!(e.to_string().contains("agents:write"), "{e}");
        let selected = token("tokens:write,agents:write", Some("tier=ci"));
        assert_eq!(selected.may_enrol(&labels), Ok(()));
        let e = selected
            .may_enrol(&Labels::new())
            .expect_err("labels outside");
        assert!(e.to_string().contains("must give labels"), "{e}");
    }

    #[test]
    fn a_selected_token_reaches_its_agents_only_and_never_the_whole_fleet() {
        let t = token("agents:write", Some("tier=ci"));
        assert_eq!(
            t.reach("c1", &parse_list("tier=ci").expect("labels")),
            Ok(())
        );
        let e = t.reach("p1", &Labels::new()).expect_err("outside");
        assert!(e.to_string().contains("agent p1 does not"), "{e}");
        assert!(t.fleet_wide("PUT /v1/admin/desired/fleet").is_err());
        assert_eq!(Caller::Root.fleet_wide("anything"), Ok(()));
    }
}
