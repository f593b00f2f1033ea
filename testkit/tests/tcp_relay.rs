//! `tcp-relay`, the proxy benchmark's floor, relays bytes both ways unchanged, and with `--http`
//! (hyper) or `--axum` (the gateway's framework) relays HTTP requests: each way a real HTTP
//! client reaches the mock upstream through it (a JSON answer and a stream on one keep-alive
//! connection) and the mock sees exactly what was sent; an unreachable upstream is a 502 over
//! HTTP, and a bad command line is an error.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use samewise_testkit::MockUpstream;
use serde_json::{Value, json};

/// A running `tcp-relay`, killed on drop.
struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tcp-relay` in front of `to` (with `mode`, a flag such as `--http`, if any); the
/// process and its URL.
fn relay(to: std::net::SocketAddr, mode: Option<&str>) -> Result<(Relay, String)> {
    let mut child = Relay(
        Command::new(env!("CARGO_BIN_EXE_tcp-relay"))
            .args(["--to", &to.to_string(), "--threads", "2"])
            .args(mode)
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().context("no stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let url = line
        .trim_end()
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected first line {line:?}"))?;
    Ok((child, url.to_owned()))
}

/// POSTs `body` as JSON to `url`; the answer's status and text.
async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Result<(u16, String)> {
    let resp = client
        .post(url)
        .bearer_auth("sk-relay")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

#[tokio::test]
async fn relays_a_json_answer_and_a_stream_unchanged() -> Result<()> {
    relays_unchanged(None).await
}

#[tokio::test]
async fn relays_http_requests_and_answers_unchanged() -> Result<()> {
    relays_unchanged(Some("--http")).await
}

#[tokio::test]
async fn relays_http_requests_and_answers_unchanged_through_axum() -> Result<()> {
    relays_unchanged(Some("--axum")).await
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_over_http() -> Result<()> {
    // a port that was free a moment ago: nothing listens there
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    for mode in ["--http", "--axum"] {
        let (_relay, url) = relay(closed, Some(mode))?;
        let client = reqwest::Client::new();
        let (status, body) = post(&client, &format!("{url}/v1/models"), &json!({})).await?;
        assert_eq!(status, 502, "{mode}");
        assert_eq!(body, "", "{mode}");
    }
    Ok(())
}

async fn relays_unchanged(mode: Option<&str>) -> Result<()> {
    let mock = MockUpstream::builder().name("floor").start().await?;
    let (_relay, url) = relay(mock.addr(), mode)?;
    let client = reqwest::Client::new();
    let ask = |stream: bool| json!({"model": "m", "messages": [{"role": "user", "content": "say hi"}], "stream": stream});
    let through = format!("{url}/v1/chat/completions");

    let (status, answer) = post(&client, &through, &ask(false)).await?;
    assert_eq!(status, 200, "{answer}");
    let answer: Value = answer.parse()?;
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "Hello from floor serving m."
    );

    let (status, streamed) = post(&client, &through, &ask(true)).await?;
    assert_eq!(status, 200, "{streamed}");
    let direct_url = format!("{}/chat/completions", mock.base_url());
    let (_, direct) = post(&client, &direct_url, &ask(true)).await?;
    // the same events in the same order (ids and timestamps aside: count and shape)
    let events = |body: &str| -> Vec<String> {
        body.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| {
                serde_json::from_str::<Value>(d).map_or(d.to_owned(), |v| v["choices"].to_string())
            })
            .collect()
    };
    assert_eq!(events(&streamed), events(&direct));
    assert_eq!(events(&streamed).last().map(String::as_str), Some("[DONE]"));

    let seen = mock.requests();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].header("Authorization"), Some("Bearer sk-relay"));
    assert_eq!(seen[0].json(), Some(ask(false)));
    assert_eq!(seen[1].json(), Some(ask(true)));
    mock.shutdown().await;
    Ok(())
}

#[test]
fn a_missing_target_is_a_usage_error() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_tcp-relay")).output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--to is required") && err.contains("usage:"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tcp-relay"))
        .args(["--to", "not-an-address"])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--to not-an-address"));
    let out = Command::new(env!("CARGO_BIN_EXE_tcp-relay"))
        .args(["--to", "127.0.0.1:9", "--http", "--axum"])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exclusive"));
    Ok(())
}
