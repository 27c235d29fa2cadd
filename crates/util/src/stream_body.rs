//! A followed job stream as an HTTP body (the runner's API and the hub's).

/// An `application/octet-stream` response whose body is what `rx` yields, as it comes:
/// a followed job stream (the runner's and the hub's).
pub fn streamed_bytes(
    rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> axum::response::Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut resp = axum::response::Response::new(axum::body::Body::from_stream(stream));
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    resp
}
