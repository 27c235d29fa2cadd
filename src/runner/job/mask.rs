//! Every secret a job was given, masked in its output before a byte of it is spooled
//! (docs/security.md, "Secrets"): so the spool, `logs --follow`, the hub and its
//! dashboard never see one.
//!
//! Each secret is searched for as written and in the encodings a program most often
//! prints it in: each line of a multi-line value, standard and URL-safe base64 in all
//! three alignments (only the characters that depend on the secret alone), URL-encoding
//! (either case of hex) and JSON string escaping; one Aho-Corasick automaton finds them
//! all in one pass. Output arrives in chunks cut anywhere (a job may print a secret a
//! byte at a time), so the end of a chunk that could be the start of a secret is held
//! back until the next chunk or the end of the stream says what it is.

use std::collections::HashSet;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine as _;

use crate::proto::secret::MIN_VALUE as MIN_SECRET;

/// The bytes of every form of a job's secrets together, at most: what the automaton and
/// the prefixes cost the runner's memory, outside the job's limits.
pub(super) const MAX_FORM_BYTES: usize = 1 << 20;
/// Forms of up to this many bytes together are searched with a DFA (a table lookup a
/// byte, the speed output needs); more with a compact NFA, whose memory stays near the
/// patterns' size where a DFA's would grow with the alphabet (docs/benchmarks.md,
/// "Secrets").
const DFA_FORM_BYTES: usize = 16 * 1024;
/// A DFA that would take more than this falls back to the compact NFA.
const MAX_DFA_MEMORY: usize = 16 << 20;
/// Patterns a quick group holds: the most aho-corasick's Teddy prefilter takes.
const QUICK_GROUP: usize = 64;
/// Quick groups a job's patterns may make; past it each would cost more than it saves.
const MAX_QUICK_GROUPS: usize = 4;
/// Values longer than this are searched for as written, line by line and in base64 (and
/// hex) only: a URL-encoded or JSON-escaped key of kilobytes is not what programs print.
const SHORT_VALUE: usize = 1024;
/// A multi-line value is masked line by line only up to this many lines.
const MAX_LINES: usize = 256;
/// Line widths base64 tools wrap at: GNU `base64` (76) and PEM (64).
const WRAPS: [usize; 2] = [76, 64];

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
    /// The same patterns in groups small enough for a vectorised prefilter (Teddy, 64
    /// patterns at most): output none of them finds anywhere needs no search by
    /// `automaton`, whose many patterns no prefilter covers (docs/benchmarks.md,
    /// "Secrets"). Empty when the groups would be too many to be quicker.
    quick: Vec<AhoCorasick>,
    /// For each pattern, what replaces it: `***NAME***`.
    replacement: Vec<Vec<u8>>,
    longest: usize,
    /// Hashes of every proper prefix of every pattern, mixed with its length: whether the
    /// end of the output may be the start of a secret, in one pass over that end. A
    /// collision only holds bytes back a little longer.
    prefixes: HashSet<u64, Mixed>,
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
        let mut replacement = Vec::new();
        let mut total = 0;
        for (name, value) in secrets {
            for p in forms(value) {
                if p.len() >= MIN_SECRET && seen.insert(p.clone()) {
                    total += p.len();
                    patterns.push(p);
                    replacement.push(format!("***{name}***").into_bytes());
                }
            }
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
        // Only beside a DFA: the same few bytes of patterns make the groups small too.
        let grouped = fast.is_some() && patterns.len().div_ceil(QUICK_GROUP) <= MAX_QUICK_GROUPS;
        let automaton = match fast {
            Some(a) => a,
            None => build(AhoCorasickKind::ContiguousNFA)?,
        };
        let quick = match grouped {
            true => patterns
                .chunks(QUICK_GROUP)
                .map(|group| {
                    // Leftmost: with the standard semantics, aho-corasick leaves the
                    // prefilter out of a DFA's search (measured: 0.6 against 4.6 GB/s).
                    AhoCorasick::builder()
                        .match_kind(MatchKind::LeftmostFirst)
                        .kind(Some(AhoCorasickKind::DFA))
                        .build(group)
                        .map_err(|e| MaskError::Build(e.to_string()))
                })
                .collect::<Result<_, _>>()?,
            false => Vec::new(),
        };
        let mut prefixes = HashSet::with_capacity_and_hasher(total, Mixed::default());
        for p in &patterns {
            let mut h = 0u64;
            for (k, &b) in p[..p.len() - 1].iter().enumerate() {
                h = h.wrapping_mul(BASE).wrapping_add(u64::from(b));
                prefixes.insert(mix(h, k + 1));
            }
        }
        Ok(Some(Arc::new(Self {
            automaton,
            quick,
            replacement,
            longest: patterns.iter().map(Vec::len).max().unwrap_or(0),
            prefixes,
        })))
    }

    /// The length of the longest end of `data` that may be the start (not the whole) of
    /// a pattern.
    fn open_prefix(&self, data: &[u8]) -> usize {
        let (mut h, mut power, mut found) = (0u64, 1u64, 0);
        for k in 1..self.longest.min(data.len() + 1) {
            h = h.wrapping_add(u64::from(data[data.len() - k]).wrapping_mul(power));
            power = power.wrapping_mul(BASE);
            if self.prefixes.contains(&mix(h, k)) {
                found = k;
            }
        }
        found
    }

    /// `data` with every pattern found in it replaced, up to `cut` (or all of it); where
    /// it stopped.
    fn replace(&self, data: &[u8], cut: Option<usize>, out: &mut Vec<u8>) -> usize {
        let mut at = 0;
        let mut cut = cut.unwrap_or(data.len());
        // Most output holds no secret: said at a prefilter's speed.
        if !self.quick.is_empty() && !self.quick.iter().any(|q| q.is_match(data)) {
            out.extend_from_slice(&data[..cut]);
            return cut;
        }
        for m in self.automaton.find_iter(data) {
            if m.end() > cut {
                // A secret whose end is not certain yet (a longer one may go on).
                cut = cut.min(m.start());
                break;
            }
            out.extend_from_slice(&data[at..m.start()]);
            out.extend_from_slice(&self.replacement[m.pattern().as_usize()]);
            at = m.end();
        }
        let cut = cut.max(at);
        out.extend_from_slice(&data[at..cut]);
        cut
    }
}

/// The prefixes' keys are hashes already, mixed with their length: hashing them again
/// (SipHash, a few dozen lookups a read of output) was a measurable part of masking.
type Mixed = std::hash::BuildHasherDefault<AsIs>;

#[derive(Default)]
struct AsIs(u64);

impl std::hash::Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const BASE: u64 = 0x100_0000_01b3;

fn mix(h: u64, len: usize) -> u64 {
    h ^ (len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// One stream's masking: the shared patterns, and what it holds back.
pub struct Masker {
    patterns: Arc<Patterns>,
    /// The end of the stream so far that may be the start of a secret.
    held: Vec<u8>,
}

impl Masker {
    pub fn new(patterns: Arc<Patterns>) -> Self {
        Self {
            patterns,
            held: Vec::new(),
        }
    }

    /// `input` masked, less what is held back for the next call.
    pub fn feed(&mut self, input: &[u8]) -> Vec<u8> {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(input);
        let cut = data.len() - self.patterns.open_prefix(&data);
        let mut out = Vec::with_capacity(data.len());
        let cut = self.patterns.replace(&data, Some(cut), &mut out);
        self.held = data[cut..].to_vec();
        out
    }

    /// What is still held, masked: the stream has ended.
    pub fn finish(&mut self) -> Vec<u8> {
        let data = std::mem::take(&mut self.held);
        let mut out = Vec::with_capacity(data.len());
        self.patterns.replace(&data, None, &mut out);
        out
    }
}

/// The forms of `value` searched for (some may be too short to use).
fn forms(value: &[u8]) -> Vec<Vec<u8>> {
    // A value too short to mask is not masked in a longer encoding either.
    if value.len() < MIN_SECRET {
        return Vec::new();
    }
    let mut all = vec![value.to_vec()];
    // Line by line: a program may print a multi-line value's lines apart.
    let lines: Vec<&[u8]> = value.split(|&b| b == b'\n').collect();
    if lines.len() <= MAX_LINES {
        for line in lines {
            all.push(line.strip_suffix(b"\r").unwrap_or(line).to_vec());
        }
    }
    let engines = [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    for engine in engines {
        for skew in 0..3 {
            all.push(base64_core(engine, value, skew));
        }
    }
    // Encoded from the start of a tool's output and wrapped as base64(1) and PEM wrap it,
    // whole and line by line.
    let whole = base64::engine::general_purpose::STANDARD.encode(value);
    for width in WRAPS {
        let lines: Vec<&[u8]> = whole.as_bytes().chunks(width).collect();
        all.push(lines.join(&b"\n"[..]));
        all.extend(
            lines
                .iter()
                .filter(|l| l.len() == width)
                .map(|l| l.to_vec()),
        );
    }
    all.push(hex(value, false));
    all.push(hex(value, true));
    if value.len() <= SHORT_VALUE {
        all.extend(short_forms(value));
    }
    all
}

/// URL-encoded (either case of hex) and JSON-escaped (as serde writes it, and with every
/// non-ASCII character as `\uXXXX`, as Python's json does).
fn short_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let url = |upper: bool| {
        let mut s = Vec::new();
        for &b in value {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                s.push(b);
            } else if upper {
                s.extend_from_slice(format!("%{b:02X}").as_bytes());
            } else {
                s.extend_from_slice(format!("%{b:02x}").as_bytes());
            }
        }
        s
    };
    let mut all = vec![url(true), url(false)];
    if let Ok(text) = std::str::from_utf8(value) {
        if let Ok(json) = serde_json::to_string(text) {
            all.push(json.as_bytes()[1..json.len() - 1].to_vec());
            let ascii: String = json[1..json.len() - 1]
                .chars()
                .flat_map(|c| match c.is_ascii() {
                    true => vec![c.to_string()],
                    false => c
                        .encode_utf16(&mut [0; 2])
                        .iter()
                        .map(|u| format!("\\u{u:04x}"))
                        .collect(),
                })
                .collect();
            all.push(ascii.into_bytes());
        }
    }
    all
}

fn hex(value: &[u8], upper: bool) -> Vec<u8> {
    value
        .iter()
        .flat_map(|b| match upper {
            true => format!("{b:02X}").into_bytes(),
            false => format!("{b:02x}").into_bytes(),
        })
        .collect()
}

/// The base64 characters of `value` encoded `skew` bytes into a stream: only those
/// whose six bits all come from `value`, so they are the same whatever surrounds it.
fn base64_core(engine: &base64::engine::GeneralPurpose, value: &[u8], skew: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; skew];
    bytes.extend_from_slice(value);
    let text = engine.encode(&bytes).into_bytes();
    let first = (8 * skew).div_ceil(6);
    let last = (8 * bytes.len()) / 6;
    text.get(first..last)
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

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
        out.extend(m.finish());
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
        out.extend(quoted.finish());
        assert_eq!(String::from_utf8_lossy(&out), r#"{"k":"***K***"}"#);
    }

    #[test]
    fn a_multi_line_value_is_masked_line_by_line() {
        let key = b"-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----\n";
        let mut m = masker_of(&[("KEY", &key[..])]);
        let mut out = m.feed(b"first line: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nwhole:\n");
        out.extend(m.feed(key));
        out.extend(m.finish());
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
        out.extend(m.finish());
        let out = String::from_utf8(out).expect("utf-8");
        assert!(!out.contains(lines[1]), "{out}");
        assert!(
            !out.contains(&String::from_utf8(hex(&long[..40], false)).expect("hex")),
            "{out}"
        );
        let mut m = masker_of(&[("U", "pässwörd-geheim".as_bytes())]);
        let mut out = m.feed(br#"{"u": "p\u00e4ssw\u00f6rd-geheim"}"#);
        out.extend(m.finish());
        assert_eq!(String::from_utf8_lossy(&out), r#"{"u": "***U***"}"#);
    }

    #[test]
    fn few_forms_are_searched_with_a_dfa_and_many_with_the_compact_nfa_alike() {
        let small = Patterns::new([("T", SECRET)]).expect("p").expect("some");
        assert_eq!(small.automaton.kind(), AhoCorasickKind::DFA);
        assert_eq!(small.quick.len(), 1);
        // A 6 KiB key: its forms (as written, lines, base64s, hex) are past the DFA's share.
        let key: Vec<u8> = (0..6000u32)
            .map(|i| b"ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"[(i * 7 % 32) as usize])
            .collect();
        let large = Patterns::new([("T", SECRET), ("K", &key[..])])
            .expect("p")
            .expect("some");
        assert_eq!(large.automaton.kind(), AhoCorasickKind::ContiguousNFA);
        assert!(large.quick.is_empty());
        for patterns in [small, large] {
            let mut m = Masker::new(patterns);
            let mut out = m.feed(b"x s3cr3t-Tok+en/42 y ");
            out.extend(m.feed(&hex(SECRET, true)));
            out.extend(m.finish());
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
}
