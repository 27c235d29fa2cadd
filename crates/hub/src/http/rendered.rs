//! The answer most reconciles get, serialised once: a change to the fleet's settings wakes
//! every agent whose own settings it reaches, and each of them is answered the same
//! desired state (no jobs, no token), so one JSON text serves them all.

use std::sync::Mutex;

use axum::body::Bytes;

use crate::proto::desired::DesiredState;
use crate::util;

#[derive(Default)]
pub(crate) struct Rendered(Mutex<Option<(DesiredState, Bytes)>>);

impl Rendered {
    /// `desired` as JSON: the text last made when it is the same state.
    pub(crate) fn json(&self, desired: &DesiredState) -> serde_json::Result<Bytes> {
        // An answer that carries jobs or a token is the agent's own: never kept.
        let common = desired.jobs.is_empty()
            && desired.cancel_jobs.is_empty()
            && desired.new_token.is_none();
        if common {
            if let Some((last, text)) = &*util::lock(&self.0) {
                if last == desired {
                    return Ok(text.clone());
                }
            }
        }
        let text = Bytes::from(serde_json::to_vec(desired)?);
        if common {
            *util::lock(&self.0) = Some((desired.clone(), text.clone()));
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::desired::NewToken;

    fn state(generation: u64) -> DesiredState {
        serde_json::from_value(serde_json::json!({
            "generation": generation,
            "runner": {"enabled": true},
        }))
        .expect("a desired state")
    }

    #[test]
    fn the_same_common_state_is_one_text_and_any_other_is_made_anew() {
        let r = Rendered::default();
        let a = r.json(&state(7)).expect("json");
        let b = r.json(&state(7)).expect("json");
        assert_eq!(a.as_ptr(), b.as_ptr(), "the text was made twice");
        assert_eq!(
            serde_json::from_slice::<DesiredState>(&a).expect("json"),
            state(7)
        );
        let c = r.json(&state(8)).expect("json");
        assert_ne!(a, c);
        // A token is never kept for the next agent.
        let mut own = state(8);
        own.new_token = Some(NewToken("rga_x".into()));
        let t = r.json(&own).expect("json");
        assert!(std::str::from_utf8(&t).expect("text").contains("rga_x"));
        assert!(!std::str::from_utf8(&r.json(&state(8)).expect("json"))
            .expect("text")
            .contains("rga_x"));
    }
}
