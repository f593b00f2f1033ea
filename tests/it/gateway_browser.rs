//! A page on another origin calling the gateway from a real headless Chromium (Debian's
//! `chromium` + `chromium-driver`), as a browser chat client does: with
//! `[server] cors_allow_origins` naming the page's origin, its `fetch`es (a key and a JSON
//! body, so each is preflighted) read an answer, a stream, an error and the model list, with
//! the gateway's own headers; a page on an origin not listed cannot call it at all (the
//! browser's preflight is refused, so its request never reaches the provider). The provider is
//! a mock speaking the real protocol on loopback; each page is served by one of the mocks
//! (another port is another origin).

use anyhow::{Context, Result, ensure};
use samewise_testkit::MockUpstream;
use samewise_testkit::webdriver::ChromeDriver;
use serde_json::{Value, json};

use crate::common::{create_key, spawn_listening};

/// What the page runs: `arguments` are the gateway's URL and a key; it calls the gateway four
/// ways and returns what it could read (or the error that kept it from reading).
const CALLS: &str = r#"
const [gw, key] = arguments;
const post = (body, auth) => fetch(gw + '/v1/chat/completions', {
  method: 'POST',
  headers: { 'Authorization': 'Bearer ' + auth, 'Content-Type': 'application/json' },
  body: JSON.stringify(body),
});
const ask = { model: 'smol', messages: [{ role: 'user', content: 'Hello' }] };
return (async () => {
  try {
    const a = await post(ask, key);
    const answer = { status: a.status, endpoint: a.headers.get('x-samewise-endpoint'),
      id: a.headers.get('x-request-id'), body: await a.json() };
    const s = await post({ ...ask, stream: true }, key);
    const stream = { status: s.status, text: await s.text() };
    const e = await post(ask, 'sw-not-a-key');
    const error = { status: e.status, body: await e.json() };
    const m = await fetch(gw + '/v1/models', { headers: { 'Authorization': 'Bearer ' + key } });
    const models = { status: m.status, body: await m.json() };
    return { answer, stream, error, models };
  } catch (e) {
    return { failed: e.name + ': ' + e.message };
  }
})();
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_a_listed_origin_calls_the_gateway_and_others_cannot() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = MockUpstream::builder().name("up").start().await?;
    let elsewhere = MockUpstream::builder().name("elsewhere").start().await?;
    let page_origin = upstream.url();
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ndata_dir = \"{}\"\ncors_allow_origins = [\"{page_origin}\"]\n\
             [providers.up]\nbase_url = \"{}\"\n\
             [models.smol]\npolicy = \"weighted\"\n\
             [[models.smol.endpoints]]\nprovider = \"up\"\nmodel = \"m\"\n",
            dir.path().join("data").display(),
            upstream.base_url(),
        ),
    )?;
    let key = create_key(&cfg, dir.path(), "page", false)?;
    let cfg_s = cfg.to_str().context("path")?.to_owned();
    let (gw, gw_url) = spawn_listening(
        &["serve", "--config", &cfg_s, "--listen", "127.0.0.1:0"],
        dir.path(),
    )?;

    let driver = ChromeDriver::start().await?;
    let b = driver.browser(&dir.path().join("chromium")).await?;
    // the page: a document of the listed origin (the mock's model list)
    b.goto(&format!("{page_origin}/v1/models")).await?;
    let got = b.execute(CALLS, vec![json!(gw_url), json!(key)]).await?;
    ensure!(
        got.get("failed").is_none(),
        "the listed origin's page: {got}"
    );
    let answer = &got["answer"];
    assert_eq!(answer["status"], 200, "{got}");
    assert_eq!(answer["endpoint"], "up/m", "{got}");
    assert!(
        answer["id"].as_str().is_some_and(|id| !id.is_empty()),
        "{got}"
    );
    assert_eq!(answer["body"]["object"], "chat.completion", "{got}");
    let stream = &got["stream"];
    assert_eq!(stream["status"], 200, "{got}");
    let text = stream["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("chat.completion.chunk") && text.contains("data: [DONE]"),
        "{got}"
    );
    assert_eq!(got["error"]["status"], 401, "{got}");
    assert_eq!(
        got["error"]["body"]["error"]["code"], "invalid_api_key",
        "{got}"
    );
    assert_eq!(got["models"]["status"], 200, "{got}");
    assert_eq!(got["models"]["body"]["data"][0]["id"], "smol", "{got}");
    let reached = upstream.completion_count();
    assert_eq!(reached, 2, "the answer and the stream reached the provider");

    // a page of an origin not listed: the browser refuses every call, none reaches the provider
    b.goto(&format!("{}/v1/models", elsewhere.url())).await?;
    let got = b.execute(CALLS, vec![json!(gw_url), json!(key)]).await?;
    let failed = got["failed"].as_str().unwrap_or_default();
    assert!(failed.starts_with("TypeError"), "{got}");
    assert_eq!(
        upstream.completion_count(),
        reached,
        "nothing more reached it"
    );
    let refused: Vec<Value> = b
        .console()
        .await?
        .into_iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains("CORS")))
        .collect();
    ensure!(!refused.is_empty(), "Chromium says why it refused");
    b.quit().await?;
    drop(driver);
    let exit = gw.stop()?;
    ensure!(exit.success(), "the gateway exited with {exit}");
    Ok(())
}
