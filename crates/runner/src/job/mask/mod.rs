//! Every secret a job was given, masked in its output before a byte of it is spooled
//! (docs/security.md, "Secrets"): so the spool, `logs --follow`, the hub and its
//! dashboard never see one.
//!
//! Each secret is searched for as written and in the encodings a program most often
//! prints it in (forms.rs); one Aho-Corasick automaton finds them all, and looks only
//! where a quicker search for a few bytes of each (quick.rs) says one may be. Output
//! arrives in chunks cut anywhere (a job may print a secret a byte at a time), so the end
//! of a chunk that could be the start of a secret is held back until the next chunk or
//! the end of the stream says what it is (prefixes.rs).

mod forms;
mod prefixes;
mod quick;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickKind, Input, MatchKind};

use crate::proto::secret::MIN_VALUE as MIN_SECRET;
use forms::forms;
use prefixes::Prefixes;
use quick::Quick;

/// The bytes of every form of a job's secrets together, at most: what the automaton and
/// the prefixes cost the runner's memory, outside the job's limits.
pub(super) const MAX_FORM_BYTES: usize = 1 << 20;
/// Forms of up to this many bytes together are searched with a DFA (a table lookup a
/// byte, the speed output needs) behind the quick search; more with a compact NFA, whose
/// memory stays near the patterns' size where a DFA's would grow with the alphabet
/// (docs/benchmarks.md, "Secrets").
const DFA_FORM_BYTES: usize = 16 * 1024;
/// A DFA that would take more than this falls back to the compact NFA.
const MAX_DFA_MEMORY: usize = 16 << 20;

/// Why a job's secrets cannot be masked.
#[derive(Debug, thiserror::Error)]
pub enum MaskError {
    #[error("the job's secrets take {0} bytes in the forms they are masked in, more than the runner searches output for ({MAX_FORM_BYTES}): give fewer or shorter ones")]
    TooMuch(usize),
    #[error("the job's secrets could not be made into a search: {0}")]
    Build(String),
}

/// A job's secrets in every form they are searched for: built once per job, shared by
/// its streams.
pub struct Patterns {
    automaton: AhoCorasick,
    /// Where a secret may be; `None` past a DFA's share of forms, where every byte goes
    /// through `automaton`.
    quick: Option<Quick>,
    /// For each pattern, what replaces it: `***NAME***`.
    replacement: Vec<Vec<u8>>,
    longest: usize,
    prefixes: Prefixes,
}

/// Refuses secrets whose forms the runner would not search output for (admission's
/// check, before anything is built).
pub fn check<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Result<(), MaskError> {
    let mut seen = HashSet::new();
    let total: usize = secrets
        .into_iter()
        .flat_map(forms)
        .filter(|p| p.len() >= MIN_SECRET && seen.insert(p.clone()))
        .map(|p| p.len())
        .sum();
    match total > MAX_FORM_BYTES {
        true => Err(MaskError::TooMuch(total)),
        false => Ok(()),
    }
}

impl Patterns {
    /// The forms of `secrets` (name, value); `None` when there is nothing to mask.
    pub fn new<'a>(
        secrets: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Option<Arc<Self>>, MaskError> {
        let mut seen = HashSet::new();
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        // Which patterns are each secret's: its forms share anchors.
        let mut owned: Vec<Range<usize>> = Vec::new();
        let mut replacement = Vec::new();
        let mut total = 0;
        for (name, value) in secrets {
            let first = patterns.len();
            for p in forms(value) {
                if p.len() >= MIN_SECRET && seen.insert(p.clone()) {
                    total += p.len();
                    patterns.push(p);
                    replacement.push(format!("***{name}***").into_bytes());
                }
            }
            owned.push(first..patterns.len());
        }
        if total > MAX_FORM_BYTES {
            return Err(MaskError::TooMuch(total));
        }
        if patterns.is_empty() {
            return Ok(None);
        }
        let build = |kind| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .kind(Some(kind))
                .build(&patterns)
                .map_err(|e| MaskError::Build(e.to_string()))
        };
        let fast = match total <= DFA_FORM_BYTES {
            true => build(AhoCorasickKind::DFA)
                .ok()
                .filter(|a| a.memory_usage() <= MAX_DFA_MEMORY),
            false => None,
        };
        // Only beside a DFA: what the quick search finds is looked at by the automaton.
        let quick = match fast.is_some() {
            true => Quick::new(
                &owned
                    .iter()
                    .map(|r| patterns[r.clone()].iter().map(Vec::as_slice).collect())
                    .collect::<Vec<_>>(),
            ),
            false => None,
        };
        let automaton = match fast {
            Some(a) => a,
            None => build(AhoCorasickKind::ContiguousNFA)?,
        };
        Ok(Some(Arc::new(Self {
            automaton,
            quick,
            replacement,
            longest: patterns.iter().map(Vec::len).max().unwrap_or(0),
            prefixes: Prefixes::new(&patterns),
        })))
    }

    /// `data` with every pattern found in it replaced, up to `cut` (or all of it): where
    /// it stopped, and whether anything was replaced (if not, `out` was left alone: the
    /// output is `data` up to there).
    fn replace(&self, data: &[u8], cut: Option<usize>, out: &mut Vec<u8>) -> (usize, bool) {
        let mut cut = cut.unwrap_or(data.len());
        let mut at = 0;
        let mut masked = false;
        let mut put = |m: aho_corasick::Match, at: &mut usize, out: &mut Vec<u8>| {
            out.extend_from_slice(&data[*at..m.start()]);
            out.extend_from_slice(&self.replacement[m.pattern().as_usize()]);
            *at = m.end();
            masked = true;
        };
        match &self.quick {
            Some(quick) => {
                let mut hits = quick.hits(data);
                let mut from = 0;
                while let Some(hit) = hits.from(from) {
                    // Whatever holds this anchor starts at most `reach` before it and
                    // ends at most `longest` after it.
                    let start = hit.saturating_sub(quick.reach).max(at);
                    let near = Input::new(data).span(start..(hit + self.longest).min(data.len()));
                    if self.automaton.find(near).is_none() {
                        from = hit + 1;
                        continue;
                    }
                    // The leftmost-longest match from there, which may go on past `near`.
                    let Some(m) = self
                        .automaton
                        .find(Input::new(data).span(start..data.len()))
                    else {
                        break;
                    };
                    if m.end() > cut {
                        cut = cut.min(m.start());
                        break;
                    }
                    put(m, &mut at, out);
                    from = at;
                }
            }
            None => {
                for m in self.automaton.find_iter(data) {
                    if m.end() > cut {
                        // A secret whose end is not certain yet (a longer one may go on).
                        cut = cut.min(m.start());
                        break;
                    }
                    put(m, &mut at, out);
                }
            }
        }
        let cut = cut.max(at);
        if masked {
            out.extend_from_slice(&data[at..cut]);
        }
        (cut, masked)
    }
}

/// One stream's masking: the shared patterns, and one buffer that holds what is held
/// back and, right after it, the next read (so no read is copied to be searched).
pub struct Masker {
    patterns: Arc<Patterns>,
    buf: Vec<u8>,
    /// What of `buf` is held back: moved to its front when the next read is asked for
    /// (the output of the last read may still be borrowed from `buf` until then).
    held: Range<usize>,
    /// The output of a read in which something was masked.
    out: Vec<u8>,
}

impl Masker {
    pub fn new(patterns: Arc<Patterns>) -> Self {
        Self {
            patterns,
            buf: Vec::new(),
            held: 0..0,
            out: Vec::new(),
        }
    }

    /// Room for a read of up to `len` bytes, right after what is held.
    pub fn space(&mut self, len: usize) -> &mut [u8] {
        let held = self.held.len();
        self.buf.copy_within(self.held.clone(), 0);
        self.held = 0..held;
        if self.buf.len() < held + len {
            self.buf.resize(held + len, 0);
        }
        &mut self.buf[held..held + len]
    }

    /// The `n` bytes just read into [`Masker::space`], masked, less what is held back
    /// for the next read.
    pub fn masked(&mut self, n: usize) -> &[u8] {
        let data = &self.buf[..self.held.end + n];
        let cut = data.len() - self.patterns.prefixes.open(data);
        self.out.clear();
        let (cut, masked) = self.patterns.replace(data, Some(cut), &mut self.out);
        self.held = cut..data.len();
        match masked {
            true => &self.out,
            false => &data[..cut],
        }
    }

    /// What is still held, masked: the stream has ended.
    pub fn finish(&mut self) -> &[u8] {
        let data = &self.buf[self.held.clone()];
        self.held = 0..0;
        self.out.clear();
        match self.patterns.replace(data, None, &mut self.out) {
            (_, true) => &self.out,
            (cut, false) => &data[..cut],
        }
    }

    /// `input` masked, less what is held back: a read copied into [`Masker::space`].
    #[cfg(test)]
    fn feed(&mut self, input: &[u8]) -> Vec<u8> {
        self.space(input.len()).copy_from_slice(input);
        self.masked(input.len()).to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::forms::hex;
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    use base64::Engine as _;

    const SECRET: &[u8] = b"s3cr3t-Tok+en/42";

    fn masker() -> Masker {
        masker_of(&[("DEPLOY_TOKEN", SECRET)])
    }

    fn masker_of(secrets: &[(&str, &[u8])]) -> Masker {
        let patterns = Patterns::new(secrets.iter().copied())
            .expect("patterns")
            .expect("something to mask");
        Masker::new(patterns)
    }

    /// `text` through a masker in pieces of `size` bytes.
    fn through(text: &[u8], size: usize) -> String {
        let mut m = masker();
        let mut out = Vec::new();
        for piece in text.chunks(size.max(1)) {
            out.extend(m.feed(piece));
        }
        out.extend_from_slice(m.finish());
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_secret_is_masked_however_the_output_is_cut() {
        let text = b"before s3cr3t-Tok+en/42 between s3cr3t-Tok+en/42after\n";
        for size in 1..=text.len() {
            assert_eq!(
                through(text, size),
                "before ***DEPLOY_TOKEN*** between ***DEPLOY_TOKEN***after\n",
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn its_encodings_are_masked_in_every_alignment() {
        for prefix in ["", "a", "ab", "abc"] {
            let mut v = prefix.as_bytes().to_vec();
            v.extend_from_slice(SECRET);
            for encoded in [STANDARD.encode(&v), URL_SAFE.encode(&v)] {
                let out = through(encoded.as_bytes(), 3);
                assert!(
                    out.contains("***DEPLOY_TOKEN***"),
                    "{prefix:?}: {encoded} → {out}"
                );
                // What is left is the prefix's own characters, and those that mix the
                // secret's last bits with padding.
                let left = out.replace("***DEPLOY_TOKEN***", "").len();
                assert!(
                    left <= (8 * prefix.len()).div_ceil(6) + 2 + 2,
                    "{prefix:?}: {out}"
                );
            }
        }
        assert_eq!(through(b"s3cr3t-Tok%2Ben%2F42", 2), "***DEPLOY_TOKEN***");
        assert_eq!(through(b"s3cr3t-Tok%2ben%2f42", 5), "***DEPLOY_TOKEN***");
        let mut quoted = masker_of(&[("K", &b"line \"one\"\\x"[..])]);
        let mut out = quoted.feed(br#"{"k":"line \"one\"\\x"}"#);
        out.extend_from_slice(quoted.finish());
        assert_eq!(String::from_utf8_lossy(&out), r#"{"k":"***K***"}"#);
    }

    #[test]
    fn a_multi_line_value_is_masked_line_by_line() {
        let key = b"-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----\n";
        let mut m = masker_of(&[("KEY", &key[..])]);
        let mut out = m.feed(b"first line: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nwhole:\n");
        out.extend(m.feed(key));
        out.extend_from_slice(m.finish());
        assert_eq!(
            String::from_utf8_lossy(&out),
            "first line: ***KEY***\nwhole:\n***KEY***"
        );
    }

    #[test]
    fn text_that_only_starts_like_a_secret_is_let_through_whole_at_the_end() {
        let mut m = masker();
        let first = m.feed(b"a s3cr3t-Tok");
        assert_eq!(first, b"a ");
        assert_eq!(m.feed(b"en is not it"), b"s3cr3t-Token is not it");
        assert_eq!(m.feed(b" s3cr"), b" ");
        assert_eq!(m.finish(), b"s3cr");
    }

    #[test]
    fn short_values_are_not_masked_and_nothing_is_a_masker_of_nothing() {
        assert!(Patterns::new([("X", &b"short"[..])]).expect("ok").is_none());
        assert!(Patterns::new(std::iter::empty()).expect("ok").is_none());
    }

    #[test]
    fn a_long_value_through_base64_wrapped_hex_and_ascii_json_is_masked() {
        let long: Vec<u8> = (0..200u8).map(|i| b'a' + i % 26).collect();
        let mut m = masker_of(&[("LONG", &long)]);
        let wrapped = base64::engine::general_purpose::STANDARD.encode(&long);
        let lines: Vec<&str> = (0..wrapped.len())
            .step_by(76)
            .map(|i| &wrapped[i..(i + 76).min(wrapped.len())])
            .collect();
        let mut out = m.feed(format!("{}\n", lines.join("\n")).as_bytes());
        out.extend(m.feed(hex(&long, false).as_slice()));
        out.extend_from_slice(m.finish());
        let out = String::from_utf8(out).expect("utf-8");
        assert!(!out.contains(lines[1]), "{out}");
        assert!(
            !out.contains(&String::from_utf8(hex(&long[..40], false)).expect("hex")),
            "{out}"
        );
        let mut m = masker_of(&[("U", "pässwörd-geheim".as_bytes())]);
        let mut out = m.feed(br#"{"u": "p\u00e4ssw\u00f6rd-geheim"}"#);
        out.extend_from_slice(m.finish());
        assert_eq!(String::from_utf8_lossy(&out), r#"{"u": "***U***"}"#);
    }

    #[test]
    fn few_forms_are_searched_with_a_dfa_and_many_with_the_compact_nfa_alike() {
        let small = Patterns::new([("T", SECRET)]).expect("p").expect("some");
        assert_eq!(small.automaton.kind(), AhoCorasickKind::DFA);
        assert_eq!(small.quick.as_ref().map(Quick::groups), Some(1));
        // A 6 KiB key: its forms (as written, lines, base64s, hex) are past the DFA's share.
        let key: Vec<u8> = (0..6000u32)
            .map(|i| b"ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"[(i * 7 % 32) as usize])
            .collect();
        let large = Patterns::new([("T", SECRET), ("K", &key[..])])
            .expect("p")
            .expect("some");
        assert_eq!(large.automaton.kind(), AhoCorasickKind::ContiguousNFA);
        assert!(large.quick.is_none());
        for patterns in [small, large] {
            let mut m = Masker::new(patterns);
            let mut out = m.feed(b"x s3cr3t-Tok+en/42 y ");
            out.extend(m.feed(&hex(SECRET, true)));
            out.extend_from_slice(m.finish());
            assert_eq!(String::from_utf8_lossy(&out), "x ***T*** y ***T***");
        }
    }

    #[test]
    fn more_than_a_megabyte_of_forms_is_refused() {
        let big = vec![b'x'; 64 * 1024];
        let many: Vec<(&str, &[u8])> = (0..8).map(|_| ("B", &big[..])).collect();
        // The same value eight times is one set of forms.
        assert!(Patterns::new(many).is_ok());
        let values: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 64 * 1024]).collect();
        let refused = Patterns::new(values.iter().map(|v| ("B", &v[..])));
        assert!(matches!(refused, Err(MaskError::TooMuch(_))));
    }

    /// Every form replaced in the whole text at once: what masking must give however
    /// the text is cut and whatever the quick search skips.
    fn at_once(p: &Patterns, text: &[u8]) -> Vec<u8> {
        let (mut out, mut at) = (Vec::new(), 0);
        for m in p.automaton.find_iter(text) {
            out.extend_from_slice(&text[at..m.start()]);
            out.extend_from_slice(&p.replacement[m.pattern().as_usize()]);
            at = m.end();
        }
        out.extend_from_slice(&text[at..]);
        out
    }

    #[test]
    fn output_cut_anywhere_among_near_misses_is_masked_as_if_searched_at_once() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=%\n -";
        let mut values: Vec<Vec<u8>> = (0..10)
            .map(|_| (0..20).map(|_| alphabet[next(64)]).collect())
            .collect();
        // Digits, which are everywhere in logs; a value whose forms contain another's.
        values.push(b"20261207".to_vec());
        values.push(b"20261207-and-more\nsecond line!".to_vec());
        let named: Vec<(String, &[u8])> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("S{i}"), &v[..]))
            .collect();
        let p = Patterns::new(named.iter().map(|(n, v)| (n.as_str(), *v)))
            .expect("patterns")
            .expect("some");
        assert!(p.quick.is_some(), "the quick search is what is tested");
        let all: Vec<Vec<u8>> = values.iter().flat_map(|v| forms(v)).collect();
        for round in 0..200 {
            let mut text = Vec::new();
            while text.len() < 4000 {
                let form = &all[next(all.len())];
                match next(4) {
                    0 => text.extend_from_slice(form),
                    1 => text.extend_from_slice(&form[..next(form.len())]),
                    2 => {
                        let mut near = form.clone();
                        let i = next(near.len());
                        near[i] = alphabet[next(alphabet.len())];
                        text.extend_from_slice(&near);
                    }
                    _ => text.extend((0..next(40)).map(|_| alphabet[next(alphabet.len())])),
                }
            }
            let mut m = Masker::new(p.clone());
            let mut out = Vec::new();
            let mut rest = &text[..];
            while !rest.is_empty() {
                let size = match round % 3 {
                    0 => 1 + next(8),
                    1 => 1 + next(300),
                    _ => 1 + next(4096),
                };
                let (piece, after) = rest.split_at(size.min(rest.len()));
                out.extend(m.feed(piece));
                rest = after;
            }
            out.extend_from_slice(m.finish());
            assert!(
                out == at_once(&p, &text),
                "round {round}: {}",
                String::from_utf8_lossy(&text)
            );
        }
    }
}
