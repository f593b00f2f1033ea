//! Secrets stay secret (issue 14, item 6): a real `samewise serve` (gateway, probes with the
//! in-process reference engine on the test model, an eval worker, dashboards) runs briefly
//! against two mock providers, each behind a provider key from the environment (the first is
//! also the evals' reference), with a client key and an admin key in use. Then everything the run produced is searched for the four secrets and for
//! their SHA-256 hashes as the store renders them (hex): the gateway's output (stdout and stderr
//! at `RUST_LOG=debug`), every row of every table, `/metrics`, every dashboard page and API
//! answer, and the gateway's answers to the client. None may appear — except each samewise key's
//! hash in its own `api_keys.key_hash`, where it is kept by design. Both providers are checked to
//! have received their keys, so the secrets were really in play. Body capture is on (every
//! request sampled), and two requests carry the client and admin keys in their bodies'
//! auth-looking fields: the stored bodies must hold neither.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::hash_key;
use samewise_store::{KeyOptions, ProbeRunQuery, Store};
use samewise_testkit::MockUpstream;
use serde_json::json;

use crate::common::{Spawn, spawn_listening_with, test_model};

fn config(data: &std::path::Path, eng: &MockUpstream, mock: &MockUpstream) -> Result<String> {
    let (eng_base, mock_base, eng_root) = (eng.base_url(), mock.base_url(), eng.url());
    Ok(format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [providers.eng]\nbase_url = \"{eng_base}\"\napi_key_env = \"SW_TEST_ENG_KEY\"\n\
         [providers.mock]\nbase_url = \"{mock_base}\"\napi_key_env = \"SW_TEST_MOCK_KEY\"\n\n\
         [models.smol]\npolicy = \"weighted\"\n\
         [[models.smol.endpoints]]\nprovider = \"eng\"\nmodel = \"smol\"\n\
         [[models.smol.endpoints]]\nprovider = \"mock\"\nmodel = \"smol\"\n\
         [models.smol.probes]\nkinds = [\"prompt_logprobs\"]\nitems_per_round = 1\ntop_k = 5\n\
         interval_ms = 1000\njitter = 0.0\n\
         [models.smol.capture]\nenabled = true\nsample = 1.0\n\n\
         [probes]\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"{}\"\n\n\
         [evals]\nreference_url = \"{eng_root}\"\nreference_model = \"smol\"\nworkers = 1\n\
         poll_ms = 200\nmax_items = 2\nlooks = 1\n",
        data.display(),
        test_model()?.display()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_appears_in_logs_records_metrics_pages_or_answers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let eng_key = format!("sk-eng-SECRET-{stamp:x}");
    let mock_key = format!("sk-mock-SECRET-{stamp:x}");

    let eng = MockUpstream::builder().start().await?;
    let mock = MockUpstream::builder().start().await?;
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(&cfg, config(&data, &eng, &mock)?)?;
    let store = Store::connect(None, &data).await?;
    let (_, client_key) = store.create_api_key("client", None).await?;
    let (_, admin_key) = store
        .create_api_key_with(
            "ops",
            KeyOptions {
                admin: true,
                ..KeyOptions::default()
            },
        )
        .await?;

    let log = dir.path().join("gateway.log");
    let spawn = Spawn {
        env: vec![
            ("SW_TEST_ENG_KEY", eng_key.clone()),
            ("SW_TEST_MOCK_KEY", mock_key.clone()),
        ],
        log_level: Some("debug"),
        log: Some(log.clone()),
    };
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let (gateway, url) = spawn_listening_with(&["serve", "--config", cfg_arg], dir.path(), &spawn)?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    // everything a client or an admin is sent, to search afterwards
    let mut seen: Vec<(String, String)> = Vec::new();

    // client traffic: JSON and streamed, to both endpoints (weighted), a wrong key, the models
    // (capture is on, every request sampled: the bodies are stored, and the keys some of them
    // carry in auth-looking fields must be redacted)
    for i in 0..8 {
        let mut body = json!({"model": "smol", "max_tokens": 8, "stream": i % 2 == 1,
            "messages": [{"role": "user", "content": "Say hi"}]});
        if i < 2 {
            body["api_key"] = json!(client_key);
            body["metadata"] = json!({"Authorization": format!("Bearer {admin_key}")});
        }
        let r = http
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&client_key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let head = format!("{:?}", r.headers());
        seen.push((format!("chat {i}"), format!("{head}\n{}", r.text().await?)));
    }
    let wrong = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(format!("{client_key}0"))
        .header("content-type", "application/json")
        .body(json!({"model": "smol", "messages": []}).to_string())
        .send()
        .await?;
    ensure!(wrong.status() == 401);
    seen.push(("wrong key".into(), wrong.text().await?));
    let models = http
        .get(format!("{url}/v1/models"))
        .bearer_auth(&client_key)
        .send()
        .await?;
    seen.push(("/v1/models".into(), models.text().await?));

    // a probe round stored, and an eval job opened by an admin and worked on
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let all_runs = ProbeRunQuery {
        model: None,
        endpoint: None,
        kind: None,
        since_ms: None,
        limit: 100,
    };
    while store.probe_runs(&all_runs).await?.len() < 2 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no probe runs within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let opened = http
        .post(format!("{url}/api/v1/evals"))
        .bearer_auth(&admin_key)
        .header("content-type", "application/json")
        .body(json!({"endpoint": "mock/smol", "suite": "tool_calls"}).to_string())
        .send()
        .await?;
    ensure!(
        opened.status() == 201,
        "opening an eval: {}",
        opened.status()
    );
    let job: serde_json::Value = serde_json::from_str(&opened.text().await?)?;
    seen.push(("POST /api/v1/evals".into(), job.to_string()));
    let id = job["id"].as_i64().context("no job id")?;
    // results on both sides (the suspect through the gateway's provider key, the reference)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let results = store.eval_results(id).await?;
        let sides: std::collections::BTreeSet<&str> =
            results.iter().map(|r| r.target.as_str()).collect();
        if sides.len() >= 2 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the eval job has results on {sides:?} only after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // every page and API answer an admin can read, and /metrics
    let paths = [
        "/".to_owned(),
        "/endpoint?e=eng/smol".to_owned(),
        "/endpoint?e=mock/smol".to_owned(),
        "/compare?a=eng/smol&b=mock/smol".to_owned(),
        "/alerts".to_owned(),
        format!("/evals/{id}"),
        "/api/v1/models".to_owned(),
        "/api/v1/overview".to_owned(),
        "/api/v1/endpoint?endpoint=mock/smol".to_owned(),
        "/api/v1/series?endpoint=mock/smol".to_owned(),
        "/api/v1/probe-series?endpoint=eng/smol&kind=prompt_logprobs".to_owned(),
        "/api/v1/alerts".to_owned(),
        "/api/v1/evals".to_owned(),
        format!("/api/v1/evals/{id}"),
        "/metrics".to_owned(),
        "/healthz".to_owned(),
    ];
    for p in &paths {
        let r = http
            .get(format!("{url}{p}"))
            .bearer_auth(&admin_key)
            .send()
            .await?;
        ensure!(r.status().is_success(), "{p}: {}", r.status());
        let head = format!("{:?}", r.headers());
        seen.push((p.clone(), format!("{head}\n{}", r.text().await?)));
    }
    let status = gateway.stop()?;
    ensure!(status.success(), "the gateway exited {status}");

    // the secrets were in play: each provider got its key
    for (provider, key) in [(&eng, &eng_key), (&mock, &mock_key)] {
        let bearer = format!("Bearer {key}");
        ensure!(
            provider
                .requests()
                .iter()
                .any(|r| r.header("authorization") == Some(bearer.as_str())),
            "a provider never received its key"
        );
    }
    let rows = samewise_store::testing::dump_tables(&store).await?;
    store.close().await;
    ensure!(
        rows.iter().any(|(t, _)| t == "request_records")
            && rows.iter().any(|(t, _)| t == "probe_runs")
            && rows.iter().any(|(t, _)| t == "eval_results")
            && rows.iter().any(|(t, _)| t == "captured_bodies"),
        "the run stored too little to search: {:?}",
        rows.iter()
            .map(|(t, _)| t)
            .collect::<std::collections::BTreeSet<_>>()
    );
    let mut sources = seen;
    sources.push(("gateway output".into(), std::fs::read_to_string(&log)?));
    for (table, row) in &rows {
        let mut row = row.clone();
        if table == "api_keys"
            && let Some(o) = row.as_object_mut()
        {
            // where a key's hash is kept by design; its plaintext is searched for still
            let hash = o.remove("key_hash").unwrap_or_default();
            ensure!(
                [&client_key, &admin_key]
                    .iter()
                    .all(|k| !hash.to_string().contains(k.as_str())),
                "a plaintext key in api_keys.key_hash"
            );
        }
        sources.push((format!("table {table}"), row.to_string()));
    }

    let mut secrets = Vec::new();
    for (name, value) in [
        ("the engine provider's key", &eng_key),
        ("the mock provider's key", &mock_key),
        ("the client key", &client_key),
        ("the admin key", &admin_key),
    ] {
        secrets.push((name.to_owned(), value.clone()));
        secrets.push((format!("{name}'s SHA-256"), hash_key(value)));
    }
    let mut found = Vec::new();
    for (where_, text) in &sources {
        for (name, value) in &secrets {
            if text.contains(value.as_str()) {
                found.push(format!("{name} in {where_}"));
            }
        }
    }
    ensure!(found.is_empty(), "secrets found: {found:#?}");
    eprintln!(
        "searched {} sources ({} rows, {} bytes of gateway output) for {} secrets",
        sources.len(),
        rows.len(),
        std::fs::metadata(&log)?.len(),
        secrets.len()
    );
    Ok(())
}
