//! A small JSON-over-HTTP helper shared by the HTTP reference backends and the probe kinds:
//! POST a JSON body, read a JSON answer, map failures (connect, status, bad JSON) to a
//! message that names the URL and, for HTTP errors, the server's error message.

use std::time::Duration;

use serde_json::Value;

/// A POST that failed, with a message fit for a probe run's `error`.
#[derive(Debug)]
pub(crate) struct HttpFailure {
    /// HTTP status, if one came back.
    pub status: Option<u16>,
    /// What went wrong.
    pub message: String,
    /// reqwest's error, when sending or reading failed (kept as the error's source).
    pub source: Option<reqwest::Error>,
}

impl std::fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A client with the probes' timeouts.
pub(crate) fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(timeout)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// POSTs `body` as JSON to `url` (with a bearer key if given) and parses the JSON answer.
pub(crate) async fn post_json(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<Value, HttpFailure> {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    // reqwest's own text for a timeout ("error sending request") hides the cause
    let cause = |e: &reqwest::Error| if e.is_timeout() { "timed out: " } else { "" };
    let resp = req.send().await.map_err(|e| HttpFailure {
        status: None,
        message: format!("POST {url}: {}{e}", cause(&e)),
        source: Some(e),
    })?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| HttpFailure {
        status: Some(status.as_u16()),
        message: format!("POST {url}: reading body: {}{e}", cause(&e)),
        source: Some(e),
    })?;
    if !status.is_success() {
        let detail = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
            });
        return Err(HttpFailure {
            status: Some(status.as_u16()),
            message: format!("POST {url}: HTTP {}: {detail}", status.as_u16()),
            source: None,
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| HttpFailure {
        status: Some(status.as_u16()),
        message: format!("POST {url}: answer is not JSON: {e}"),
        source: None,
    })
}
