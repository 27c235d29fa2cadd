//! A request's head as the connection reads it: just enough to tell an agent's reconcile
//! from every other request, and where each request ends. Anything unusual is hyper's to
//! serve (and to refuse, in its own words).

/// Headers read at the most; a request with more is hyper's (it answers 431).
const MAX_HEADERS: usize = 32;
/// The longest body a request is framed by here (1 TiB, past any the hub takes): a head
/// and its body's length always add up without overflow.
const MAX_LENGTH: u64 = 1 << 40;

/// What the bytes read so far begin with.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Head<'a> {
    /// The head is not complete yet.
    Partial,
    /// An agent's `POST /v1/agents/{id}/reconcile`, with one bearer token and a body of
    /// `body` bytes.
    Reconcile(Reconcile<'a>),
    /// Any other request: its head takes `len` bytes and its body `body` more.
    Other { len: usize, body: u64, close: bool },
    /// A request whose end this reader cannot tell (a chunked body, HTTP/1.0, an upgrade,
    /// a malformed head): the rest of the connection is hyper's.
    Hyper,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Reconcile<'a> {
    pub(super) id: &'a str,
    pub(super) token: &'a str,
    /// The `wait` the query asks for, in seconds.
    pub(super) wait: u64,
    /// The head's length in bytes.
    pub(super) len: usize,
    /// The body's, from `Content-Length`.
    pub(super) body: u64,
    /// The client asked for the connection to close after the answer.
    pub(super) close: bool,
}

/// Reads the head at the start of `buf`.
pub(super) fn parse(buf: &[u8]) -> Head<'_> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Hyper,
    };
    if req.version != Some(1) {
        return Head::Hyper;
    }
    let mut body = None;
    let mut close = false;
    let mut expect = false;
    let mut tokens = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("authorization"));
    let token = match (tokens.next(), tokens.next()) {
        (Some(h), None) => bearer(h.value),
        _ => None,
    };
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            match (body, content_length(h.value)) {
                (None, Some(n)) => body = Some(n),
                _ => return Head::Hyper,
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Head::Hyper;
        } else if name.eq_ignore_ascii_case("connection") {
            close |= has_token(h.value, "close");
        } else if name.eq_ignore_ascii_case("expect") {
            expect = true;
        }
    }
    let body = body.unwrap_or(0);
    let reconcile = match (req.method, req.path, token) {
        (Some("POST"), Some(target), Some(token)) if !expect => {
            reconcile_target(target).map(|(id, wait)| Reconcile {
                id,
                token,
                wait,
                len,
                body,
                close,
            })
        }
        _ => None,
    };
    match reconcile {
        Some(r) => Head::Reconcile(r),
        None => Head::Other { len, body, close },
    }
}

/// `/v1/agents/{id}/reconcile[?wait=N]`: the id and the wait. A target with anything the
/// router would decode (`%`, `+`) or a `wait` that is not one number is the router's.
fn reconcile_target(target: &str) -> Option<(&str, u64)> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let id = path
        .strip_prefix("/v1/agents/")?
        .strip_suffix("/reconcile")?;
    if id.is_empty() || id.contains(['/', '%']) || query.contains(['%', '+']) {
        return None;
    }
    let mut wait = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "wait" {
            if wait.is_some() {
                return None;
            }
            wait = Some(value.parse::<u64>().ok()?);
        }
    }
    Some((id, wait.unwrap_or(0)))
}

/// The token of an `Authorization: Bearer …` value written as the router accepts it.
fn bearer(value: &[u8]) -> Option<&str> {
    // What `HeaderValue::to_str` accepts: visible ASCII, spaces and tabs.
    if !value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return None;
    }
    crate::token::bearer_text(std::str::from_utf8(value).ok()?).ok()
}

/// A length this reader frames requests by: at most [`MAX_LENGTH`]; a larger one is
/// hyper's to refuse.
fn content_length(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|&n| n <= MAX_LENGTH)
}

/// Whether a comma-separated header value names `token` (in any case).
pub(super) fn has_token(value: &[u8], token: &str) -> bool {
    std::str::from_utf8(value)
        .unwrap_or("")
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "POST /v1/agents/web-1/reconcile?wait=30 HTTP/1.1\r\n\
        authorization: Bearer rga_secret\r\n\
        content-type: application/json\r\n\
        content-length: 120\r\n\
        host: hub:8443\r\n\r\n";

    #[test]
    fn an_agents_reconcile_is_read_with_its_id_token_wait_and_length() {
        assert_eq!(
            parse(AGENT.as_bytes()),
            Head::Reconcile(Reconcile {
                id: "web-1",
                token: "rga_secret",
                wait: 30,
                len: AGENT.len(),
                body: 120,
                close: false,
            })
        );
        // Its first bytes, then the head with the body's first bytes behind it.
        assert_eq!(parse(&AGENT.as_bytes()[..40]), Head::Partial);
        let more = format!("{AGENT}{{\"version\"");
        assert!(matches!(parse(more.as_bytes()), Head::Reconcile(r) if r.len == AGENT.len()));
        let closing = AGENT.replace("host:", "Connection: keep-alive, Close\r\nhost:");
        assert!(matches!(parse(closing.as_bytes()), Head::Reconcile(r) if r.close));
    }

    #[test]
    fn whatever_the_router_would_decode_or_refuse_is_another_request() {
        for (from, to) in [
            ("?wait=30", "?wait=soon"),
            ("?wait=30", "?wait=30&wait=1"),
            ("?wait=30", "?w%61it=30"),
            ("web-1", "web%2D1"),
            ("web-1", "a/b"),
            ("POST", "PUT"),
            ("Bearer rga_secret", "Basic cnJy"),
            ("host:", "expect: 100-continue\r\nhost:"),
            ("host:", "authorization: Bearer other\r\nhost:"),
        ] {
            let head = AGENT.replace(from, to);
            assert!(
                matches!(parse(head.as_bytes()), Head::Other { .. }),
                "{from} -> {to}"
            );
        }
        let get = "GET /v1/health HTTP/1.1\r\nhost: hub\r\n\r\n";
        assert_eq!(
            parse(get.as_bytes()),
            Head::Other {
                len: get.len(),
                body: 0,
                close: false
            }
        );
        // No wait is no hold.
        let now = AGENT.replace("?wait=30", "");
        assert!(matches!(parse(now.as_bytes()), Head::Reconcile(r) if r.wait == 0));
    }

    #[test]
    fn requests_whose_end_cannot_be_told_here_are_hyper_s() {
        for (from, to) in [
            ("content-length: 120", "transfer-encoding: chunked"),
            (
                "content-length: 120",
                "content-length: 120\r\ncontent-length: 12",
            ),
            ("content-length: 120", "content-length: -1"),
            // Its head and body would wrap past u64::MAX.
            (
                "content-length: 120",
                "content-length: 18446744073709551560",
            ),
            ("content-length: 120", "content-length: 1099511627777"),
            ("HTTP/1.1", "HTTP/1.0"),
            ("host:", "upgrade: websocket\r\nhost:"),
            ("POST /v1", "POST\0/v1"),
        ] {
            let head = AGENT.replace(from, to);
            assert_eq!(parse(head.as_bytes()), Head::Hyper, "{from} -> {to}");
        }
        let many = AGENT.replace("host:", &"x-a: b\r\n".repeat(MAX_HEADERS));
        assert_eq!(parse(many.as_bytes()), Head::Hyper);
    }
}
