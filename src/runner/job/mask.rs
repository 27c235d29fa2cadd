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

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;

use crate::proto::secret::MIN_VALUE as MIN_SECRET;

pub(super) struct Masker {
    automaton: AhoCorasick,
    patterns: Vec<Vec<u8>>,
    /// For each pattern, what replaces it: `***NAME***`.
    replacement: Vec<Vec<u8>>,
    /// The end of the stream so far that may be the start of a secret.
    held: Vec<u8>,
}

impl Masker {
    /// A masker of `secrets` (name, value); `None` when there is nothing to mask.
    pub(super) fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Option<Self> {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut replacement = Vec::new();
        for (name, value) in secrets {
            for p in forms(value) {
                if p.len() >= MIN_SECRET && !patterns.contains(&p) {
                    patterns.push(p);
                    replacement.push(format!("***{name}***").into_bytes());
                }
            }
        }
        if patterns.is_empty() {
            return None;
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok()?;
        Some(Self {
            automaton,
            patterns,
            replacement,
            held: Vec::new(),
        })
    }

    /// `input` masked, less what is held back for the next call.
    pub(super) fn feed(&mut self, input: &[u8]) -> Vec<u8> {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(input);
        let mut cut = data.len() - self.open_prefix(&data);
        let mut out = Vec::with_capacity(data.len());
        let mut at = 0;
        for m in self.automaton.find_iter(&data) {
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
        self.held = data[cut..].to_vec();
        out
    }

    /// What is still held, masked: the stream has ended.
    pub(super) fn finish(&mut self) -> Vec<u8> {
        let data = std::mem::take(&mut self.held);
        let mut out = Vec::with_capacity(data.len());
        let mut at = 0;
        for m in self.automaton.find_iter(&data) {
            out.extend_from_slice(&data[at..m.start()]);
            out.extend_from_slice(&self.replacement[m.pattern().as_usize()]);
            at = m.end();
        }
        out.extend_from_slice(&data[at..]);
        out
    }

    /// The length of the longest end of `data` that is the start (not the whole) of a
    /// pattern.
    fn open_prefix(&self, data: &[u8]) -> usize {
        let longest = self.patterns.iter().map(Vec::len).max().unwrap_or(0);
        (1..longest.min(data.len() + 1))
            .rev()
            .find(|&k| {
                let tail = &data[data.len() - k..];
                self.patterns
                    .iter()
                    .any(|p| p.len() > k && p.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

/// The forms of `value` searched for (some may be too short to use).
fn forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut all = vec![value.to_vec()];
    // Line by line: a program may print a multi-line value's lines apart.
    for line in value.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        all.push(line.to_vec());
    }
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for skew in 0..3 {
            all.push(base64_core(engine, value, skew));
        }
    }
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
    all.push(url(true));
    all.push(url(false));
    if let Ok(text) = std::str::from_utf8(value) {
        if let Ok(json) = serde_json::to_string(text) {
            all.push(json.as_bytes()[1..json.len() - 1].to_vec());
        }
    }
    all
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
        Masker::new([("DEPLOY_TOKEN", SECRET)]).expect("a masker")
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
        let quoted = Masker::new([("K", &b"line \"one\"\\x"[..])]).expect("m");
        let mut quoted = quoted;
        let mut out = quoted.feed(br#"{"k":"line \"one\"\\x"}"#);
        out.extend(quoted.finish());
        assert_eq!(String::from_utf8_lossy(&out), r#"{"k":"***K***"}"#);
    }

    #[test]
    fn a_multi_line_value_is_masked_line_by_line() {
        let key = b"-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----\n";
        let mut m = Masker::new([("KEY", &key[..])]).expect("m");
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
        assert!(Masker::new([("X", &b"short"[..])]).is_none());
        assert!(Masker::new(std::iter::empty()).is_none());
    }
}
