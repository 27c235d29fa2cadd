//! Output almost never holds a secret: saying so at a vectorised prefilter's speed is
//! most of what masking costs (docs/benchmarks.md, "Secrets").
//!
//! Every form of a secret holds an *anchor*: a few bytes of it, chosen so that one
//! anchor serves as many forms of the same secret as it can (a token as written, its
//! URL-encoding and its JSON escape share most of their bytes; so do its standard and
//! URL-safe base64). The anchors, far fewer than the forms, are searched for with
//! aho-corasick's packed searcher (Teddy: up to 64 patterns a group, 32 or 16 bytes of
//! output an instruction); where one is found, the job's full automaton looks only
//! around it.

use aho_corasick::packed::{self, MatchKind};
use aho_corasick::Span;

use crate::proto::secret::MIN_VALUE as MIN_SECRET;

/// An anchor's length: the shortest a form may be, so that every form has one.
const ANCHOR: usize = MIN_SECRET;
/// Anchors a group holds: the most Teddy takes.
const GROUP: usize = 64;
/// Groups a job's anchors may make; past it each pass would cost more than it saves.
const MAX_GROUPS: usize = 4;
/// Where in a form its anchor is looked for: enough to find one shared with the other
/// forms, few enough that choosing stays cheap for forms of kilobytes.
const CANDIDATES: usize = 64;

/// The anchors of a job's forms, searched for in groups.
pub(super) struct Quick {
    groups: Vec<packed::Searcher>,
    /// How far before an anchor the form holding it may start.
    pub(super) reach: usize,
}

impl Quick {
    /// The anchors of `secrets` (each secret's forms); `None` when they would take more
    /// groups than pay, or the machine has no vectorised search.
    pub(super) fn new(secrets: &[Vec<&[u8]>]) -> Option<Self> {
        let mut anchors: Vec<&[u8]> = secrets.iter().flat_map(|f| anchors(f)).collect();
        anchors.sort_unstable();
        anchors.dedup();
        if anchors.is_empty() || anchors.len().div_ceil(GROUP) > MAX_GROUPS {
            return None;
        }
        let groups = anchors
            .chunks(GROUP)
            .map(|group| {
                packed::Config::new()
                    .match_kind(MatchKind::LeftmostFirst)
                    .builder()
                    .extend(group)
                    .build()
            })
            .collect::<Option<_>>()?;
        let longest = secrets.iter().flatten().map(|f| f.len()).max()?;
        Some(Self {
            groups,
            reach: longest - ANCHOR,
        })
    }

    #[cfg(test)]
    pub(super) fn groups(&self) -> usize {
        self.groups.len()
    }

    /// A search of `data` for anchors, from left to right.
    pub(super) fn hits<'a>(&'a self, data: &'a [u8]) -> Hits<'a> {
        Hits {
            quick: self,
            data,
            next: [Next::Unknown; MAX_GROUPS],
        }
    }
}

/// Each group's next anchor, remembered so that a group is searched again only past it.
#[derive(Clone, Copy)]
enum Next {
    Unknown,
    At(usize),
    None,
}

pub(super) struct Hits<'a> {
    quick: &'a Quick,
    data: &'a [u8],
    /// One for each group (at most `MAX_GROUPS`): no allocation per read.
    next: [Next; MAX_GROUPS],
}

impl Hits<'_> {
    /// Where the first anchor at or after `from` starts.
    pub(super) fn from(&mut self, from: usize) -> Option<usize> {
        let mut first = None;
        for (group, next) in self.quick.groups.iter().zip(self.next.iter_mut()) {
            let stale = match *next {
                Next::Unknown => true,
                Next::At(at) => at < from,
                Next::None => false,
            };
            if stale {
                *next = match from < self.data.len() {
                    true => group
                        .find_in(self.data, Span::from(from..self.data.len()))
                        .map_or(Next::None, |m| Next::At(m.start())),
                    false => Next::None,
                };
            }
            if let Next::At(at) = *next {
                first = Some(first.map_or(at, |f: usize| f.min(at)));
            }
        }
        first
    }
}

/// Anchors such that each of `forms` holds one: each taken from the shortest form not yet
/// served, where it serves the most of the others.
fn anchors<'a>(forms: &[&'a [u8]]) -> Vec<&'a [u8]> {
    let mut open: Vec<&[u8]> = forms
        .iter()
        .copied()
        .filter(|f| f.len() >= ANCHOR)
        .collect();
    open.sort_by_key(|f| f.len());
    let mut chosen = Vec::new();
    while let Some(&shortest) = open.first() {
        let mut best = (0, &shortest[..ANCHOR]);
        for window in shortest.windows(ANCHOR).take(CANDIDATES) {
            let served = open.iter().filter(|f| holds(f, window)).count();
            if served > best.0 {
                best = (served, window);
            }
        }
        open.retain(|f| !holds(f, best.1));
        chosen.push(best.1);
    }
    chosen
}

fn holds(form: &[u8], anchor: &[u8]) -> bool {
    form.windows(anchor.len()).any(|w| w == anchor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_anchor_serves_the_forms_that_share_it_and_every_form_holds_one() {
        let forms: Vec<&[u8]> = vec![
            b"s3cr3t-Tok+en/42",
            b"s3cr3t-Tok%2Ben%2F42",
            b"s3cr3t-Tok%2ben%2f42",
            b"czNjcjN0LVRvaytlbi80Mg",
            b"czNjcjN0LVRvaytlbi80Mg==",
        ];
        let chosen = anchors(&forms);
        assert_eq!(chosen.len(), 2, "{chosen:?}");
        for f in &forms {
            assert!(chosen.iter().any(|a| holds(f, a)), "{f:?}");
        }
    }
}
