//! Label selectors (docs/hub.md, "Selectors and the fleet's queue"), in the grammar of
//! Kubernetes' label selectors: requirements joined by commas, each one of `key`
//! (exists), `!key` (absent), `key=value` (`==` too), `key!=value`, `key in (a,b)` and
//! `key notin (a,b)`. A job that names one is routed to any agent whose labels match.
//!
//! As in Kubernetes, `!=` and `notin` match an agent without the key. An empty selector
//! is refused rather than read as "every agent": routing a job to any host of the fleet,
//! production included, is said with a label every host has (`os=linux`).

use std::collections::BTreeSet;
use std::fmt;

use super::labels::{check_key, check_value, InForce, Labels};

/// The most requirements one selector may hold.
pub const MAX_REQUIREMENTS: usize = 32;
/// The longest selector text, in bytes.
pub const MAX_LEN: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Requirement {
    Exists(String),
    Absent(String),
    Eq(String, String),
    Ne(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

impl Requirement {
    /// Whether the labels `get` reads meet it.
    fn holds<'a>(&self, get: impl Fn(&str) -> Option<&'a String>) -> bool {
        match self {
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::Absent(k) => get(k).is_none(),
            Requirement::Eq(k, v) => get(k) == Some(v),
            Requirement::Ne(k, v) => get(k) != Some(v),
            Requirement::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => !get(k).is_some_and(|v| set.contains(v)),
        }
    }

    /// The key it is about.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Exists(k)
            | Requirement::Absent(k)
            | Requirement::Eq(k, _)
            | Requirement::Ne(k, _)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _) => k,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        match self {
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::Absent(k) => write!(f, "!{k}"),
            Requirement::Eq(k, v) => write!(f, "{k}={v}"),
            Requirement::Ne(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, s) => write!(f, "{k} in ({})", set(s)),
            Requirement::NotIn(k, s) => write!(f, "{k} notin ({})", set(s)),
        }
    }
}

/// A parsed selector: every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        Parser::new(text).selector()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|r| r.holds(|k| labels.get(k)))
    }

    /// [`Selector::matches`] on the labels in force, read where they are.
    pub fn matches_in_force(&self, labels: InForce<'_>) -> bool {
        self.0.iter().all(|r| r.holds(|k| labels.get(k)))
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.0
    }

    /// Whether every set of labels this selector matches also matches `outer`: a token
    /// selecting `outer` may make one selecting `self` (docs/security.md, "Rights never
    /// grow by delegation"). Decided key by key, exactly: the states a key may be in
    /// under `self` (absent, or one of some values) must all be states `outer` allows.
    pub fn within(&self, outer: &Selector) -> bool {
        outer.0.iter().all(|r| {
            let key = r.key();
            let mine = self
                .0
                .iter()
                .filter(|m| m.key() == key)
                .fold(States::all(), |acc, m| acc.and(&States::of(m)));
            mine.subset(&States::of(r))
        })
    }
}

/// The states one key may be in (`None`: absent; `Some(v)`: the value `v`), as a set:
/// either the few listed, or all but the few listed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum States {
    Only(BTreeSet<Option<String>>),
    AllBut(BTreeSet<Option<String>>),
}

impl States {
    fn all() -> Self {
        States::AllBut(BTreeSet::new())
    }

    fn of(r: &Requirement) -> Self {
        let values = |s: &BTreeSet<String>| s.iter().cloned().map(Some).collect();
        match r {
            Requirement::Exists(_) => States::AllBut([None].into()),
            Requirement::Absent(_) => States::Only([None].into()),
            Requirement::Eq(_, v) => States::Only([Some(v.clone())].into()),
            Requirement::Ne(_, v) => States::AllBut([Some(v.clone())].into()),
            Requirement::In(_, s) => States::Only(values(s)),
            Requirement::NotIn(_, s) => States::AllBut(values(s)),
        }
    }

    fn and(&self, other: &States) -> States {
        use States::{AllBut, Only};
        match (self, other) {
            (Only(a), Only(b)) => Only(a.intersection(b).cloned().collect()),
            (Only(a), AllBut(x)) | (AllBut(x), Only(a)) => Only(a.difference(x).cloned().collect()),
            (AllBut(x), AllBut(y)) => AllBut(x.union(y).cloned().collect()),
        }
    }

    fn subset(&self, of: &States) -> bool {
        use States::{AllBut, Only};
        match (self, of) {
            (Only(a), Only(b)) => a.is_subset(b),
            (Only(a), AllBut(x)) => a.is_disjoint(x),
            // Values are unbounded: all but a few is never inside a few.
            (AllBut(_), Only(_)) => false,
            (AllBut(x), AllBut(y)) => y.is_subset(x),
        }
    }
}

/// The canonical text: requirements in the order given, sets sorted, no spaces but
/// around `in` and `notin`. Parsing it gives the same selector.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// A selector that does not parse: what was wrong, at which character (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    pub text: String,
    /// Characters before the bad one.
    pub at: usize,
    pub why: String,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let before: String = self.text.chars().take(self.at).collect();
        match self.text.chars().nth(self.at) {
            Some(c) => write!(
                f,
                "invalid selector {:?}: {} at character {} ({c:?}, after {before:?})",
                self.text,
                self.why,
                self.at + 1
            ),
            None => write!(
                f,
                "invalid selector {:?}: {} at its end (after {before:?})",
                self.text, self.why
            ),
        }
    }
}

impl std::error::Error for SelectorError {}

/// A word of the grammar: a key, a value, `in` or `notin`.
fn word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._/-".contains(c)
}

struct Parser<'a> {
    text: &'a str,
    chars: Vec<char>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            chars: text.chars().collect(),
            pos: 0,
        }
    }

    fn fail<T>(&self, at: usize, why: impl Into<String>) -> Result<T, SelectorError> {
        Err(SelectorError {
            text: self.text.to_owned(),
            at,
            why: why.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    /// A word (possibly empty) and where it starts.
    fn word(&mut self) -> (usize, String) {
        self.skip_spaces();
        let start = self.pos;
        while self.peek().is_some_and(word_char) {
            self.pos += 1;
        }
        (start, self.chars[start..self.pos].iter().collect())
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_spaces();
        let n = s.chars().count();
        let ahead: String = self.chars.iter().skip(self.pos).take(n).collect();
        if ahead == s {
            self.pos += n;
            true
        } else {
            false
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        let (at, key) = self.word();
        if key.is_empty() {
            return self.fail(at, "a label key was expected");
        }
        if check_key(&key).is_err() {
            return self.fail(
                at,
                format!("{key:?} is no label key (1 to 63 of a-z 0-9 . _ / -, starting with a letter or digit)"),
            );
        }
        Ok(key)
    }

    fn value(&mut self, key: &str) -> Result<String, SelectorError> {
        let (at, value) = self.word();
        if check_value(key, &value).is_err() {
            return self.fail(
                at,
                format!("{value:?} is no label value (at most 63 of A-Z a-z 0-9 . _ -)"),
            );
        }
        Ok(value)
    }

    fn set(&mut self, key: &str) -> Result<BTreeSet<String>, SelectorError> {
        if !self.eat("(") {
            return self.fail(self.pos, "\"(\" was expected");
        }
        let mut set = BTreeSet::new();
        loop {
            set.insert(self.value(key)?);
            if self.eat(")") {
                return Ok(set);
            }
            if !self.eat(",") {
                return self.fail(self.pos, "\",\" or \")\" was expected");
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        if self.eat("!") {
            return Ok(Requirement::Absent(self.key()?));
        }
        let key = self.key()?;
        self.skip_spaces();
        if self.peek().is_none() || self.peek() == Some(',') {
            return Ok(Requirement::Exists(key));
        }
        if self.eat("!=") {
            let v = self.value(&key)?;
            return Ok(Requirement::Ne(key, v));
        }
        if self.eat("==") || self.eat("=") {
            let v = self.value(&key)?;
            return Ok(Requirement::Eq(key, v));
        }
        let (at, op) = self.word();
        match op.as_str() {
            "in" => Ok(Requirement::In(key.clone(), self.set(&key)?)),
            "notin" => Ok(Requirement::NotIn(key.clone(), self.set(&key)?)),
            _ => self.fail(at, "\"=\", \"!=\", \"in\", \"notin\" or \",\" was expected"),
        }
    }

    fn selector(mut self) -> Result<Selector, SelectorError> {
        if self.text.len() > MAX_LEN {
            return self.fail(0, format!("a selector is at most {MAX_LEN} bytes"));
        }
        self.skip_spaces();
        if self.peek().is_none() {
            return self.fail(
                0,
                "an empty selector would match every agent; select on a label every agent has (os=linux)",
            );
        }
        let mut all = Vec::new();
        loop {
            all.push(self.requirement()?);
            if all.len() > MAX_REQUIREMENTS {
                return self.fail(self.pos, format!("at most {MAX_REQUIREMENTS} requirements"));
            }
            self.skip_spaces();
            match self.peek() {
                None => return Ok(Selector(all)),
                Some(',') => self.pos += 1,
                Some(_) => return self.fail(self.pos, "\",\" was expected"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::parse_list;

    fn matches(selector: &str, labels: &str) -> bool {
        Selector::parse(selector)
            .expect("selector")
            .matches(&parse_list(labels).expect("labels"))
    }

    #[test]
    fn every_kind_of_requirement_matches_as_in_kubernetes() {
        let host = "queue=build,os=linux,gpu=a100,tier=dev,zone=b";
        assert!(matches(
            "queue=build,os=linux,gpu,tier!=prod,zone in (a,b)",
            host
        ));
        assert!(matches("queue==build", host));
        assert!(!matches("queue=test", host));
        assert!(matches("!spot", host));
        assert!(!matches("!gpu", host));
        assert!(matches("spot!=yes", host), "!= matches a missing key");
        assert!(matches("spot notin (yes)", host), "so does notin");
        assert!(!matches("zone notin (a, b)", host));
        assert!(!matches("spot in (yes,no)", host));
        assert!(matches("k8s.io/arch in (x86_64)", "k8s.io/arch=x86_64"));
        assert!(matches("empty=", "empty="));
    }

    #[test]
    fn a_selector_is_within_another_when_everything_it_matches_the_other_matches() {
        let within = |inner: &str, outer: &str| {
            Selector::parse(inner)
                .expect("inner")
                .within(&Selector::parse(outer).expect("outer"))
        };
        for (inner, outer) in [
            ("tier=ci", "tier=ci"),
            ("tier=ci,queue=build", "tier=ci"),
            ("tier=ci", "tier in (ci,dev)"),
            ("tier in (ci)", "tier!=prod"),
            ("tier=ci", "tier"),
            ("tier=ci", "tier notin (prod,stage)"),
            ("!tier", "tier!=prod"),
            ("tier in (a,b),tier!=b", "tier=a"),
            ("tier!=prod,tier!=stage", "tier notin (prod,stage)"),
        ] {
            assert!(within(inner, outer), "{inner} within {outer}");
        }
        for (inner, outer) in [
            ("queue=build", "tier=ci"),
            ("tier in (ci,prod)", "tier=ci"),
            ("tier", "tier=ci"),
            ("tier!=prod", "tier=ci"),
            ("tier!=prod", "tier"),
            ("tier notin (prod)", "tier notin (prod,stage)"),
            ("!tier", "tier"),
            ("tier=ci", "!tier"),
        ] {
            assert!(!within(inner, outer), "{inner} not within {outer}");
        }
    }

    #[test]
    fn the_canonical_text_parses_to_the_same_selector() {
        let s = Selector::parse(" zone in ( b , a ),!spot ,gpu, tier != prod").expect("parses");
        assert_eq!(s.to_string(), "zone in (a,b),!spot,gpu,tier!=prod");
        assert_eq!(Selector::parse(&s.to_string()), Ok(s));
    }

    #[test]
    fn a_bad_selector_points_at_the_bad_character() {
        for (text, at, part) in [
            ("queue=build,", 12, "key was expected"),
            ("queue=build,,os", 12, "key was expected"),
            ("Queue=build", 0, "no label key"),
            ("zone in (a,b", 12, "\",\" or \")\""),
            ("zone in a", 8, "\"(\""),
            ("zone within (a)", 5, "\"in\", \"notin\""),
            ("tier!=p r", 8, "\",\" was expected"),
            ("tier=a b", 7, "\",\" was expected"),
            ("gpu=a100)", 8, "\",\" was expected"),
            ("gpu=(a)", 4, "\",\" was expected"),
            ("", 0, "empty selector"),
            ("  ", 0, "empty selector"),
        ] {
            let e = Selector::parse(text).expect_err(text);
            assert_eq!((e.at, e.why.contains(part)), (at, true), "{text:?}: {e}");
            let shown = e.to_string();
            assert!(shown.contains(&format!("{text:?}")), "{shown}");
        }
        let e = Selector::parse("queue=build,tier!").expect_err("bad");
        assert!(
            e.to_string()
                .contains("at character 17 ('!', after \"queue=build,tier\")"),
            "{e}"
        );
    }
}
