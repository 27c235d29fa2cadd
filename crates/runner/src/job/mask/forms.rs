//! The forms a secret is searched for in output: as written, each line of a multi-line
//! value, standard and URL-safe base64 in all three alignments (only the characters that
//! depend on the secret alone), base64 wrapped as tools wrap it, hex, URL-encoding
//! (either case of hex) and JSON string escaping.

use base64::Engine as _;

use crate::proto::secret::MIN_VALUE as MIN_SECRET;

/// Values longer than this are searched for as written, line by line and in base64 (and
/// hex) only: a URL-encoded or JSON-escaped key of kilobytes is not what programs print.
const SHORT_VALUE: usize = 1024;
/// A multi-line value is masked line by line only up to this many lines.
const MAX_LINES: usize = 256;
/// Line widths base64 tools wrap at: GNU `base64` (76) and PEM (64).
const WRAPS: [usize; 2] = [76, 64];

/// The forms of `value` searched for (some may be too short to use).
pub(super) fn forms(value: &[u8]) -> Vec<Vec<u8>> {
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

pub(super) fn hex(value: &[u8], upper: bool) -> Vec<u8> {
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
