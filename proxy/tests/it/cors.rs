//! Browsers calling the OpenAI routes from another origin (`[server] cors_allow_origins`): the
//! preflight is answered before any key check, an allowed origin's answers (errors and streams
//! included) carry `Access-Control-Allow-Origin` and expose the gateway's headers, an origin
//! not listed gets a 403 preflight and no CORS header, and without the setting nothing changes
//! (a preflight is the 405 any `OPTIONS` is). The same in a real browser:
//! `tests/it/gateway_browser.rs` at the workspace root.

use crate::common;

use anyhow::Result;
use common::*;
use reqwest::Method;
use reqwest::header::HeaderMap;
use samewise_testkit::MockUpstream;

const PAGE: &str = "https://app.example.com";

fn cfg(mock: &MockUpstream, server: &str) -> String {
    format!(
        "{server}{FAST_LIMITS}{}{}",
        provider("p1", &mock.base_url(), ""),
        model("smol", "weighted", &[("p1", "up")])
    )
}

fn h<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A browser's preflight for a POST with a key and a JSON body, from `origin`.
async fn preflight(gw: &Gateway, path: &str, origin: &str) -> Result<reqwest::Response> {
    Ok(gw
        .http
        .request(Method::OPTIONS, gw.url(path))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type,x-stainless-os",
        )
        .send()
        .await?)
}

#[tokio::test]
async fn listed_origins_may_call_the_openai_routes() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let server =
        format!("[server]\ncors_allow_origins = [\"{PAGE}\", \"http://localhost:3000\"]\n");
    let gw = Gateway::start(&cfg(&mock, &server)).await?;

    // the preflight: no key asked, the page's headers echoed, cached by origin
    for path in ["/v1/chat/completions", "/v1/models"] {
        let resp = preflight(&gw, path, "https://APP.example.com").await?;
        assert_eq!(resp.status(), 204, "{path}");
        let hs = resp.headers();
        assert_eq!(
            h(hs, "access-control-allow-origin"),
            Some("https://APP.example.com")
        );
        assert_eq!(h(hs, "access-control-allow-methods"), Some("GET, POST"));
        assert_eq!(
            h(hs, "access-control-allow-headers"),
            Some("authorization,content-type,x-stainless-os")
        );
        assert_eq!(h(hs, "access-control-max-age"), Some("7200"));
        assert_eq!(
            h(hs, "vary"),
            Some("Origin, Access-Control-Request-Headers")
        );
        assert!(hs.get("access-control-allow-credentials").is_none());
        assert!(resp.bytes().await?.is_empty());
    }

    // an answer, a stream and an error each readable by the page, the gateway's headers exposed
    let body = serde_json::to_vec(&chat_body("smol"))?;
    let mut stream = chat_body("smol");
    stream["stream"] = serde_json::json!(true);
    let stream = serde_json::to_vec(&stream)?;
    for (what, key, body, status) in [
        ("answer", true, &body, 200),
        ("stream", true, &stream, 200),
        ("no key", false, &body, 401),
    ] {
        let mut rb = gw
            .http
            .post(gw.url("/v1/chat/completions"))
            .header("origin", PAGE)
            .header("content-type", "application/json")
            .body(body.clone());
        if key {
            rb = rb.bearer_auth(&gw.key);
        }
        let resp = rb.send().await?;
        assert_eq!(resp.status(), status, "{what}");
        let hs = resp.headers();
        assert_eq!(h(hs, "access-control-allow-origin"), Some(PAGE), "{what}");
        assert_eq!(
            h(hs, "access-control-expose-headers"),
            Some("x-request-id, x-samewise-endpoint, retry-after"),
            "{what}"
        );
        assert_eq!(h(hs, "vary"), Some("Origin"), "{what}");
        assert!(hs.get("x-request-id").is_some(), "{what}");
        let text = resp.text().await?;
        if what == "stream" {
            assert!(text.contains("[DONE]"), "{text}");
        }
    }
    let resp = gw
        .http
        .get(gw.url("/v1/models"))
        .bearer_auth(&gw.key)
        .header("origin", "http://localhost:3000")
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        h(resp.headers(), "access-control-allow-origin"),
        Some("http://localhost:3000")
    );

    // an origin not listed: its preflight is refused in OpenAI's shape, its answers carry no
    // CORS header (the browser keeps them from the page)
    for origin in [
        "https://evil.example",
        "https://app.example.com.evil",
        "null",
    ] {
        let resp = preflight(&gw, "/v1/chat/completions", origin).await?;
        assert_eq!(resp.status(), 403, "{origin}");
        assert!(resp.headers().get("access-control-allow-origin").is_none());
        let err: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
        assert_eq!(err["error"]["code"], "origin_not_allowed", "{err}");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(origin) && msg.contains("cors_allow_origins"),
            "{msg}"
        );
        let resp = gw
            .http
            .get(gw.url("/v1/models"))
            .bearer_auth(&gw.key)
            .header("origin", origin)
            .send()
            .await?;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("access-control-allow-origin").is_none());
    }

    // an OPTIONS that is not a preflight, and routes outside /v1/, are not CORS's
    let resp = gw
        .http
        .request(Method::OPTIONS, gw.url("/v1/chat/completions"))
        .header("origin", PAGE)
        .send()
        .await?;
    assert_eq!(resp.status(), 405);
    let resp = preflight(&gw, "/metrics", PAGE).await?;
    assert_eq!(resp.status(), 405);
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    let resp = gw
        .http
        .get(gw.url("/healthz"))
        .header("origin", PAGE)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    gw.stop().await
}

#[tokio::test]
async fn any_origin_with_a_star_and_none_by_default() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "[server]\ncors_allow_origins = [\"*\"]\n")).await?;
    let resp = preflight(&gw, "/v1/completions", "null").await?;
    assert_eq!(resp.status(), 204);
    assert_eq!(h(resp.headers(), "access-control-allow-origin"), Some("*"));
    assert_eq!(
        h(resp.headers(), "vary"),
        Some("Access-Control-Request-Headers")
    );
    let resp = gw
        .http
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("origin", "https://anywhere.example")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("smol"))?)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(h(resp.headers(), "access-control-allow-origin"), Some("*"));
    assert!(resp.headers().get("vary").is_none());
    gw.stop().await?;

    // the default: no CORS at all
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    let resp = preflight(&gw, "/v1/chat/completions", PAGE).await?;
    assert_eq!(resp.status(), 405);
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    let resp = gw
        .http
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("origin", PAGE)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("smol"))?)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    gw.stop().await
}
