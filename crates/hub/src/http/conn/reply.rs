//! An answer written as HTTP/1.1 by the connection itself: a reconcile's, whose body is
//! known in whole (JSON), so it goes out as one write with its length.

use std::io::Write as _;

use axum::http::header;
use axum::response::Response;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// The largest answer written here: a desired state with a thousand jobs is far less.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// Writes `resp`; `close` tells the client the connection ends with it.
pub(super) async fn write<T: AsyncWrite + Unpin>(
    io: &mut T,
    resp: Response,
    close: bool,
) -> std::io::Result<()> {
    let out = render(resp, close).await?;
    send(io, &out, close).await
}

/// Writes a 200 with a JSON `body`: a reconcile's answer, without a response to take
/// apart first.
pub(super) async fn write_json<T: AsyncWrite + Unpin>(
    io: &mut T,
    body: &[u8],
    close: bool,
) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(160 + body.len());
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n");
    end(&mut out, body, close);
    send(io, &out, close).await
}

async fn send<T: AsyncWrite + Unpin>(io: &mut T, out: &[u8], close: bool) -> std::io::Result<()> {
    io.write_all(out).await?;
    if close {
        io.shutdown().await
    } else {
        io.flush().await
    }
}

async fn render(resp: Response, close: bool) -> std::io::Result<Vec<u8>> {
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, MAX_ANSWER)
        .await
        .map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(192 + body.len());
    let status = parts.status;
    write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or("")
    )?;
    for (name, value) in &parts.headers {
        if [header::CONTENT_LENGTH, header::CONNECTION, header::DATE].contains(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    end(&mut out, &body, close);
    Ok(out)
}

/// The headers every answer ends with (its length, the date, perhaps `close`), then
/// its body.
fn end(out: &mut Vec<u8>, body: &[u8], close: bool) {
    let _ = write!(
        out,
        "content-length: {}\r\ndate: {}\r\n",
        body.len(),
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    #[tokio::test]
    async fn an_answer_is_a_status_line_its_headers_a_length_and_the_body() {
        let resp = (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::RETRY_AFTER, "1"),
                (header::CONTENT_TYPE, "application/json"),
            ],
            "{\"error\":\"x\"}",
        )
            .into_response();
        let text = String::from_utf8(render(resp, true).await.expect("render")).expect("text");
        let (head, body) = text.split_once("\r\n\r\n").expect("head");
        let mut lines = head.lines();
        assert_eq!(lines.next(), Some("HTTP/1.1 503 Service Unavailable"));
        let headers: Vec<&str> = lines.collect();
        for h in [
            "retry-after: 1",
            "content-type: application/json",
            "content-length: 13",
            "connection: close",
        ] {
            assert!(headers.contains(&h), "{h} in {headers:?}");
        }
        assert!(headers.iter().any(|h| h.starts_with("date: ")));
        assert_eq!(body, "{\"error\":\"x\"}");
    }

    #[tokio::test]
    async fn a_reconciles_answer_is_a_200_with_its_json_and_its_length() {
        let mut out = Vec::new();
        write_json(&mut out, b"{\"generation\":3}", false)
            .await
            .expect("write");
        let text = String::from_utf8(out).expect("text");
        let (head, body) = text.split_once("\r\n\r\n").expect("head");
        let mut lines = head.lines();
        assert_eq!(lines.next(), Some("HTTP/1.1 200 OK"));
        let headers: Vec<&str> = lines.collect();
        for h in ["content-type: application/json", "content-length: 16"] {
            assert!(headers.contains(&h), "{h} in {headers:?}");
        }
        assert!(!headers.iter().any(|h| h.starts_with("connection")));
        assert_eq!(body, "{\"generation\":3}");
    }
}
