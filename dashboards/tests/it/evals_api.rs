//! `POST /api/v1/evals` and `GET /api/v1/evals`: an admin opens a job (201, its id and
//! URLs; the job queued in the store with what was asked, a customer suite's items carried
//! in its params); every refusal is OpenAI-shaped JSON naming what is wrong — no key (401),
//! a client key (403), a session without its CSRF token (403), a malformed body, an unknown
//! endpoint / suite / baseline (400, with `param`) — and opens nothing.

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::common::{Server, body, post};

async fn jobs(s: &Server) -> Result<usize> {
    Ok(s.db.store.eval_jobs(None, None, 1000).await?.len())
}

#[tokio::test]
async fn an_admin_opens_a_job_and_finds_it_listed() -> Result<()> {
    let s = Server::start().await?;
    let before = jobs(&s).await?;
    let res = post(
        &s.url,
        "/api/v1/evals",
        Some(&s.admin),
        &[],
        r#"{"endpoint": "ref/m", "suite": "tool_calls", "baseline": "w4/m"}"#,
    )
    .await?;
    ensure!(res.status() == 201, "status {}", res.status());
    let created = body(res).await?;
    let id = created["id"].as_i64().context("no id")?;
    ensure!(created["url"] == format!("/evals/{id}"), "{created}");
    ensure!(
        created["api_url"] == format!("/api/v1/evals/{id}"),
        "{created}"
    );
    ensure!(
        created["state"] == "queued"
            && created["endpoint"] == "ref/m"
            && created["baseline"] == "w4/m"
            && created["suite"] == "tool_calls"
            && created["model"] == "m",
        "{created}"
    );
    let stored = s.db.store.eval_job(id).await?.context("job not stored")?;
    ensure!(stored.params["opened_by"] == "api" && stored.alert_id.is_none());
    // its page and its API document exist at once
    let page = s.get(&format!("/evals/{id}"), Some(&s.admin)).await?;
    ensure!(page.status() == 200, "job page {}", page.status());
    let doc = s.json(&format!("/api/v1/evals/{id}")).await?;
    ensure!(doc["job"]["state"] == "queued", "{doc}");

    // the baseline defaults to the reference; a customer suite's items travel with the job
    let res = post(
        &s.url,
        "/api/v1/evals",
        Some(&s.admin),
        &[],
        r#"{"endpoint": "w4/m", "suite": "smoke"}"#,
    )
    .await?;
    ensure!(res.status() == 201, "status {}", res.status());
    let smoke = body(res).await?;
    let smoke_id = smoke["id"].as_i64().context("no id")?;
    ensure!(smoke["baseline"] == "reference", "{smoke}");
    let stored = s.db.store.eval_job(smoke_id).await?.context("not stored")?;
    let items = stored.params["custom"]["items"]
        .as_array()
        .context("no items in params")?;
    ensure!(items.len() == 2, "{}", stored.params);
    ensure!(items[0]["id"] == "capital" && items[1]["id"] == "line-2");
    ensure!(jobs(&s).await? == before + 2);

    // listed, newest first, filtered by endpoint, limited
    let all = s.json("/api/v1/evals").await?;
    let list = all["jobs"].as_array().context("no jobs")?;
    ensure!(list.len() == before + 2, "{all}");
    ensure!(list[0]["id"] == smoke_id && list[1]["id"] == id, "{all}");
    let w4 = s.json("/api/v1/evals?endpoint=w4/m").await?;
    let w4 = w4["jobs"].as_array().context("no jobs")?;
    ensure!(
        !w4.is_empty() && w4.iter().all(|j| j["endpoint"] == "w4/m"),
        "{w4:?}"
    );
    ensure!(w4.iter().any(|j| j["id"] == smoke_id));
    ensure!(!w4.iter().any(|j| j["id"] == id));
    let one = s.json("/api/v1/evals?limit=1").await?;
    ensure!(one["jobs"].as_array().map(Vec::len) == Some(1), "{one}");
    let unknown = s.get("/api/v1/evals?endpoint=zz/m", Some(&s.admin)).await?;
    ensure!(unknown.status() == 404);
    s.stop().await
}

/// (status, error object) of a POST.
async fn refused(
    s: &Server,
    key: Option<&str>,
    headers: &[(&str, &str)],
    payload: &str,
) -> Result<(u16, Value)> {
    let res = post(&s.url, "/api/v1/evals", key, headers, payload).await?;
    let status = res.status().as_u16();
    let b = body(res).await?;
    Ok((status, b["error"].clone()))
}

#[tokio::test]
async fn every_refusal_is_a_clear_openai_error_and_opens_nothing() -> Result<()> {
    let s = Server::start().await?;
    let before = jobs(&s).await?;
    let good = r#"{"endpoint": "ref/m", "suite": "tool_calls"}"#;
    // (key, body, status, error code, error param, words in the message)
    type Case<'a> = (
        Option<&'a str>,
        &'a str,
        u16,
        &'a str,
        Option<&'a str>,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (None, good, 401, "invalid_api_key", None, "admin key"),
        (
            Some(&s.client),
            good,
            403,
            "admin_key_required",
            None,
            "not an admin key",
        ),
        (
            Some("sw-unknown"),
            good,
            401,
            "invalid_api_key",
            None,
            "admin key",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "zz/m", "suite": "tool_calls"}"#,
            400,
            "unknown_endpoint",
            Some("endpoint"),
            "unknown endpoint \"zz/m\" (configured: ref/m, tool/m, w4/m, x/o)",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "ref/m", "suite": "mmlu"}"#,
            400,
            "unknown_suite",
            Some("suite"),
            "unknown suite \"mmlu\" (known: tool_calls, long_context, regression, smoke)",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "ref/m", "suite": "tool_calls", "baseline": "zz/m"}"#,
            400,
            "unknown_baseline",
            Some("baseline"),
            "unknown baseline \"zz/m\"",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "ref/m", "suite": "tool_calls", "baseline": "ref/m"}"#,
            400,
            "unknown_baseline",
            Some("baseline"),
            "is the endpoint itself",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "ref/m""#,
            400,
            "invalid_parameter",
            None,
            "the body must be JSON",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "ref/m"}"#,
            400,
            "invalid_parameter",
            None,
            "missing field `suite`",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": 7, "suite": "tool_calls"}"#,
            400,
            "invalid_parameter",
            None,
            "invalid type",
        ),
        (
            Some(&s.admin),
            r#"{"endpoint": "ref/m", "suite": "tool_calls", "suite_file": "/etc/passwd"}"#,
            400,
            "invalid_parameter",
            None,
            "unknown field `suite_file`",
        ),
        (
            Some(&s.admin),
            "",
            400,
            "invalid_parameter",
            None,
            "the body must be JSON",
        ),
    ];
    for (key, payload, status, code, param, message) in cases {
        let (got, err) = refused(&s, key, &[], payload).await?;
        ensure!(got == status, "{payload}: {got} {err}");
        ensure!(err["code"] == code, "{payload}: {err}");
        ensure!(err["type"].is_string(), "{payload}: {err}");
        ensure!(
            err["message"].as_str().is_some_and(|m| m.contains(message)),
            "{payload}: {err}"
        );
        ensure!(
            err.get("param").and_then(Value::as_str) == param,
            "{payload}: {err}"
        );
    }
    ensure!(jobs(&s).await? == before, "a refused request opened a job");
    s.stop().await
}

#[tokio::test]
async fn a_session_must_present_its_csrf_token() -> Result<()> {
    let s = Server::start().await?;
    let (status, cookie, _) = s.login(&s.admin).await?;
    ensure!(status == 303, "login {status}");
    let cookie = cookie.context("no session cookie")?;
    let page = Server::http()?
        .get(format!("{}/alerts", s.url))
        .header("cookie", &cookie)
        .send()
        .await?
        .text()
        .await?;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .context("no CSRF token on the page")?
        .to_owned();
    let before = jobs(&s).await?;
    let payload = json!({"endpoint": "ref/m", "suite": "long_context"}).to_string();
    for headers in [
        vec![("cookie", cookie.as_str())],
        vec![("cookie", cookie.as_str()), ("x-csrf-token", "0")],
    ] {
        let (status, err) = refused(&s, None, &headers, &payload).await?;
        ensure!(status == 403 && err["code"] == "csrf", "{status} {err}");
    }
    ensure!(jobs(&s).await? == before);
    let res = post(
        &s.url,
        "/api/v1/evals",
        None,
        &[("cookie", cookie.as_str()), ("x-csrf-token", csrf.as_str())],
        &payload,
    )
    .await?;
    ensure!(res.status() == 201, "with the token: {}", res.status());
    ensure!(jobs(&s).await? == before + 1);
    s.stop().await
}
