//! The served model over real loopback HTTP against the real test model: `/v1/models` and
//! `/v1/models/{model}`, a request naming another model (vLLM's 404 `model_not_found`) or
//! none, the health routes, and `/tokenize`, `/detokenize` and `/v1/score` on text and chats.

use crate::common::server::{TestServer, chat_prompt};

use serde_json::json;

const PROMPT: &str = "The capital of France is Paris. The capital of Italy is";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_tokenize_detokenize() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    // `model` may be omitted (the probes' reference client does)
    let (s, _, v) = srv
        .post_raw(
            "/v1/completions",
            json!({"prompt": PROMPT, "max_tokens": 1}).to_string(),
        )
        .await?;
    assert_eq!(s, 200, "{v}");
    for path in ["/healthz", "/health"] {
        let (s, v) = srv.get(path).await?;
        assert_eq!((s, v["status"].as_str()), (200, Some("ok")), "{path}");
    }
    let (s, v) = srv.get("/v1/models").await?;
    assert_eq!(s, 200);
    assert_eq!(v["data"][0]["id"], "smollm2");
    assert_eq!(v["data"][0]["max_model_len"], 8192);
    // OpenAI's `models.retrieve`: the list's entry, or a 404 naming the code
    assert_eq!(srv.get_ok("/v1/models/smollm2").await?, v["data"][0]);
    for other in ["/v1/models/gpt-4o", "/v1/models/org/smollm2"] {
        let (s, e) = srv.get(other).await?;
        assert_eq!(
            (s, &e["error"]["code"]),
            (404, &json!("model_not_found")),
            "{e}"
        );
    }
    let (s, e) = srv.get("/v1/models/%FF").await?;
    assert_eq!(
        (s, &e["error"]["code"]),
        (400, &json!("invalid_path")),
        "{e}"
    );
    let t = srv
        .ok("/tokenize", &json!({"prompt": "Hello, world! 🚀"}))
        .await?;
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone())?;
    assert_eq!(ids, srv.state.tokenizer().encode("Hello, world! 🚀", true)?);
    assert_eq!(t["count"], ids.len());
    let d = srv.ok("/detokenize", &json!({"tokens": ids})).await?;
    assert_eq!(d["prompt"], "Hello, world! 🚀");
    let t = srv
        .ok(
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await?;
    let want = chat_prompt(&srv.state, "Hi")?;
    assert_eq!(t["tokens"], json!(want));
    let s = srv.ok("/v1/score", &json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true})).await?;
    assert_eq!(s["tokens"], json!(want));
    srv.shutdown().await
}

/// A request naming another model than the served one, as vLLM answers it: a gateway
/// configured with the wrong model id finds out on its first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_models_name_is_model_not_found() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let user = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (
            "/v1/completions",
            json!({"model": "gpt-4o", "prompt": "hi"}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "smollm2-1.7b", "messages": user}),
        ),
        ("/tokenize", json!({"model": "gpt-4o", "prompt": "hi"})),
        ("/detokenize", json!({"model": "gpt-4o", "tokens": [1]})),
        ("/v1/score", json!({"model": "gpt-4o", "tokens": [1, 2]})),
    ];
    for (path, body) in cases {
        let (status, _, v) = srv.post_raw(path, body.to_string()).await?;
        assert_eq!(
            (status, &v["error"]["code"], &v["error"]["type"]),
            (
                404,
                &json!("model_not_found"),
                &json!("invalid_request_error")
            ),
            "{path} {body}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(body["model"].as_str().unwrap_or("?")),
            "{v}"
        );
        // the same request naming the served model is answered
        let mut served = body.clone();
        served["model"] = json!("smollm2");
        if path.ends_with("completions") {
            served["max_tokens"] = json!(1);
        }
        let (status, _, v) = srv.post_raw(path, served.to_string()).await?;
        assert_eq!(status, 200, "{path} {served}: {v}");
    }
    srv.shutdown().await
}
