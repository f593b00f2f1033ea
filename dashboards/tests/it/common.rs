//! A dashboards server for tests: a fresh store, an admin key and a client key, two models
//! (`m` with endpoints `ref/m`, `w4/m`, `tool/m`, and `other` with `x/o`), traffic through
//! the store's insert path, probe runs and alerts — including strings carrying `<script>`.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use samewise_dashboards::{Band, Dashboards, DashboardsConfig, LiveState, ModelSpec, Routing, Slo};
use samewise_store::testing::TestDb;
use samewise_store::{
    Backend, JobState, KeyOptions, NewAlert, NewEvalJob, ProbeRun, RequestRecord,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A tool name / finish reason / alert summary that would set a global if it ran.
pub const XSS: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";

/// Probe runs stored per endpoint of model `m` (logprob kind).
pub const RUNS: usize = 6;

/// Routing as a fixed table.
#[derive(Debug, Default)]
pub struct FixedRouting(pub HashMap<String, Routing>);

impl LiveState for FixedRouting {
    fn routing(&self, _model: &str, endpoint: &str) -> Option<Routing> {
        self.0.get(endpoint).cloned()
    }
}

/// A running dashboards server.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its store.
    pub db: TestDb,
    /// An admin key's plaintext.
    pub admin: String,
    /// A non-admin key's plaintext.
    pub client: String,
    /// The id of the w4 endpoint's unfaithful alert.
    pub unfaithful_alert: i64,
    /// The id of the alert whose summary carries [`XSS`].
    pub xss_alert: i64,
    /// Attempts stored per endpoint of model `m`.
    pub attempts: i64,
    /// The dashboards' state the server runs.
    pub dash: Dashboards,
    /// Holds the customer suite `smoke` (two items) the evals opener knows.
    pub _suites: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// A server over SQLite.
    pub async fn start() -> Result<Server> {
        Server::start_on(Backend::Sqlite).await
    }

    /// A server over `backend`, with the test data loaded.
    pub async fn start_on(backend: Backend) -> Result<Server> {
        let db = TestDb::new(backend).await?;
        let (_, admin) = db
            .store
            .create_api_key_with(
                "ops",
                KeyOptions {
                    rpm_limit: None,
                    admin: true,
                },
            )
            .await?;
        let (_, client) = db.store.create_api_key("app", None).await?;
        let now = samewise_store::now_ms();
        let attempts = 40;
        let mut records = Vec::new();
        for (e, err_every) in [("ref/m", 0), ("w4/m", 0), ("tool/m", 4)] {
            for i in 0..attempts {
                let mut r = RequestRecord {
                    request_id: format!("{e}-{i}"),
                    attempt: 1,
                    final_attempt: true,
                    ts_ms: now - 3_600_000 + i * 60_000,
                    model: "m".to_owned(),
                    provider: Some(e.split('/').next().unwrap_or_default().to_owned()),
                    endpoint: Some(e.to_owned()),
                    route: "chat".to_owned(),
                    status: Some(200),
                    attempts: 1,
                    ttft_ms: Some(80.0 + i as f64),
                    latency_ms: 400.0,
                    tpot_ms: Some(12.0),
                    prompt_tokens: Some(20),
                    completion_tokens: Some(10),
                    finish_reason: Some("stop".to_owned()),
                    ..RequestRecord::default()
                };
                if err_every > 0 && i % err_every == 0 {
                    r.tool_calls = 1;
                    r.tool_unknown_name = 1;
                    r.tool_errored = true;
                    r.finish_reason = Some(XSS.to_owned());
                } else if e == "tool/m" {
                    r.tool_calls = 1;
                }
                records.push(r);
            }
        }
        db.store.insert_request_records(&records).await?;
        for (e, kl) in [("ref/m", 0.001), ("w4/m", 0.08), ("tool/m", 0.002)] {
            for i in 0..RUNS {
                db.store
                    .insert_probe_run(&ProbeRun {
                        model: "m".to_owned(),
                        endpoint: e.to_owned(),
                        kind: "prompt_logprobs".to_owned(),
                        started_ms: now - 7_200_000 + i as i64 * 600_000,
                        finished_ms: now - 7_200_000 + i as i64 * 600_000 + 1_000,
                        ok: true,
                        tokens: 100,
                        stats: serde_json::json!({ "kl_mean": kl * (1.0 + i as f64 / 10.0), "top1_same": 0.9 }),
                        ..ProbeRun::default()
                    })
                    .await?;
            }
        }
        // a tool_calls probe run: the endpoint's calls valid for their schemas 72% of the
        // time, the reference's always
        db.store
            .insert_probe_run(&ProbeRun {
                model: "m".to_owned(),
                endpoint: "tool/m".to_owned(),
                kind: "tool_calls".to_owned(),
                started_ms: now - 600_000,
                finished_ms: now - 599_000,
                ok: true,
                tokens: 900,
                stats: serde_json::json!({ "trigger_f1": 0.9, "schema_accuracy": 0.72, "reference_schema_accuracy": 1.0 }),
                ..ProbeRun::default()
            })
            .await?;
        let (unfaithful, _) = db
            .store
            .upsert_alert(&NewAlert {
                model: "m".to_owned(),
                endpoint: "w4/m".to_owned(),
                kind: "unfaithful".to_owned(),
                summary: "endpoint w4/m behaves like ≈4.2-bit weights".to_owned(),
                evidence: serde_json::json!({
                    "detector": "faithful", "statistic": "kl_mean", "value": 0.08,
                    "equivalent": { "relation": "approx", "bits": 4.2, "better": 5, "worse": 4 },
                    "probe_runs": [1]
                }),
                now_ms: now - 60_000,
            })
            .await?;
        let (xss, _) = db
            .store
            .upsert_alert(&NewAlert {
                model: "m".to_owned(),
                endpoint: "tool/m".to_owned(),
                kind: "passive".to_owned(),
                summary: XSS.to_owned(),
                evidence: serde_json::json!({ "tool_name": XSS, "answer": XSS }),
                now_ms: now - 30_000,
            })
            .await?;
        // a finished tool_calls job on tool/m judged "degraded", and a queued one on w4/m
        for (endpoint, finish) in [("tool/m", true), ("w4/m", false)] {
            db.store
                .enqueue_eval_job(
                    &NewEvalJob {
                        model: "m".to_owned(),
                        endpoint: endpoint.to_owned(),
                        suite: "tool_calls".to_owned(),
                        baseline: "reference".to_owned(),
                        // tool/m's job was opened by its passive alert
                        alert_id: finish.then_some(xss.id),
                        params: serde_json::json!({}),
                        max_attempts: 1,
                        now_ms: now - 20_000,
                    },
                    0,
                )
                .await?
                .context("job not opened")?;
            if finish {
                let (_, lease) = db
                    .store
                    .claim_eval_job("w", now - 19_000, 60_000)
                    .await?
                    .context("job not claimed")?;
                // two items: one the corruption broke (with a model-written XSS payload in the
                // answer), one both sides passed
                for (item, target, passed, err) in [
                    ("weather-1", "suspect", false, Some("wrong_name")),
                    ("weather-1", "baseline", true, None),
                    ("book-2", "suspect", true, None),
                    ("book-2", "baseline", true, None),
                ] {
                    db.store
                        .insert_eval_result(
                            &lease,
                            &samewise_store::EvalResult {
                                item: item.to_owned(),
                                target: target.to_owned(),
                                passed,
                                error_type: err.map(str::to_owned),
                                tokens: 10,
                                record: serde_json::json!({ "answer": XSS, "check": { "passed": passed } }),
                            },
                            now - 15_000,
                        )
                        .await?;
                }
                let verdict = serde_json::json!({
                    "verdict": "degraded", "items": 24, "p_value": 0.0004,
                    "suspect": { "rate": 0.0 }, "baseline": { "rate": 0.5 }
                });
                db.store
                    .finish_eval_job(
                        &lease,
                        JobState::Succeeded,
                        Some(&verdict),
                        None,
                        now - 10_000,
                    )
                    .await?;
            }
        }
        let models = vec![
            ModelSpec {
                name: "m".to_owned(),
                endpoints: vec!["ref/m".to_owned(), "w4/m".to_owned(), "tool/m".to_owned()],
                slo: Some(Slo {
                    ttft_ms: 100.0,
                    tpot_ms: 15.0,
                }),
                ladder: vec![
                    Band {
                        name: "w8".to_owned(),
                        bits: 8,
                        kl_mean: 0.0005,
                    },
                    Band {
                        name: "w4".to_owned(),
                        bits: 4,
                        kl_mean: 0.07,
                    },
                ],
            },
            ModelSpec {
                name: "other".to_owned(),
                endpoints: vec!["x/o".to_owned()],
                slo: None,
                ladder: Vec::new(),
            },
        ];
        let routing = FixedRouting(HashMap::from([
            (
                "ref/m".to_owned(),
                Routing {
                    state: "active",
                    why: None,
                },
            ),
            (
                "w4/m".to_owned(),
                Routing {
                    state: "demoted",
                    why: Some("active drift alert".to_owned()),
                },
            ),
            (
                "tool/m".to_owned(),
                Routing {
                    state: "active",
                    why: None,
                },
            ),
        ]));
        // the evals opener, as `samewise serve` builds it: the endpoints of both models,
        // a reference URL, and a customer suite `smoke`
        let suites = tempfile::tempdir()?;
        let smoke = suites.path().join("smoke.jsonl");
        std::fs::write(
            &smoke,
            "{\"id\": \"capital\", \"request\": {\"messages\": [{\"role\": \"user\", \"content\": \"Capital of France?\"}]}, \"check\": {\"kind\": \"contains\", \"value\": \"Paris\"}}\n\
             {\"request\": {\"messages\": [{\"role\": \"user\", \"content\": \"Say 4\"}]}, \"check\": {\"kind\": \"regex\", \"pattern\": \"\\\\b4\\\\b\"}}\n",
        )?;
        let evals_table: toml::Table = format!(
            "reference_url = \"http://127.0.0.1:9\"\n[suites.smoke]\npath = {:?}\n",
            smoke.display().to_string()
        )
        .parse()?;
        let evals = samewise_evals::EvalsConfig::parse(Some(&evals_table), None)?;
        let endpoints = models
            .iter()
            .flat_map(|m| m.endpoints.iter().map(|e| (e.clone(), m.name.clone())))
            .collect::<Vec<_>>();
        let dash = Dashboards::new(
            db.store.clone(),
            models,
            Arc::new(routing),
            DashboardsConfig::default(),
            Some(samewise_evals::Opener::new(evals, endpoints)),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let app = samewise_dashboards::router(dash.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Server {
            url,
            db,
            admin,
            client,
            unfaithful_alert: unfaithful.id,
            xss_alert: xss.id,
            attempts,
            dash,
            _suites: suites,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// A client that does not follow redirects (so tests see them).
    pub fn http() -> Result<reqwest::Client> {
        Ok(reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?)
    }

    /// GET `path` with `key` as Bearer (None: no credentials).
    pub async fn get(&self, path: &str, key: Option<&str>) -> Result<reqwest::Response> {
        let mut req = Server::http()?.get(format!("{}{path}", self.url));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        Ok(req.send().await?)
    }

    /// GET `path` as the admin and parse JSON (status must be 200).
    pub async fn json(&self, path: &str) -> Result<serde_json::Value> {
        let res = self.get(path, Some(&self.admin)).await?;
        let status = res.status();
        let text = res.text().await?;
        anyhow::ensure!(status == 200, "GET {path}: {status} {text}");
        serde_json::from_str(&text).with_context(|| format!("GET {path}: {text}"))
    }

    /// Logs in with `key` through the form; returns the session cookie (`name=value`).
    pub async fn login(
        &self,
        key: &str,
    ) -> Result<(reqwest::StatusCode, Option<String>, Option<String>)> {
        let res = Server::http()?
            .post(format!("{}/login", self.url))
            .form(&[("key", key)])
            .send()
            .await?;
        let set = res
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let pair = set
            .as_deref()
            .and_then(|s| s.split(';').next())
            .map(str::to_owned);
        Ok((res.status(), pair, set))
    }

    /// Stops the server.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await??;
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// POSTs `body` (raw) to `path` with `key` as Bearer (None: no credentials) and `headers`.
pub async fn post(
    url: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<reqwest::Response> {
    let mut req = Server::http()?
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    Ok(req.send().await?)
}

/// The JSON body of `res` (reqwest is built without its `json` feature).
pub async fn body(res: reqwest::Response) -> Result<serde_json::Value> {
    let text = res.text().await?;
    serde_json::from_str(&text).with_context(|| format!("not JSON: {text}"))
}
