//! Authentication: every route refuses a missing key (401 for the API, a redirect to the
//! login form for pages) and a non-admin key (403); the login form sets an HttpOnly,
//! SameSite=Strict session cookie only for an admin key; POSTs under a session need its CSRF
//! token; no key or hash is ever rendered.

use anyhow::{Result, ensure};

use crate::common::{Server, body};

/// Every GET route of the dashboards.
const GETS: &[&str] = &[
    "/",
    "/endpoint?e=ref/m",
    "/compare?a=ref/m&b=w4/m",
    "/alerts",
    "/alerts/1",
    "/evals/1",
    "/api/v1/models",
    "/api/v1/overview",
    "/api/v1/endpoint?endpoint=ref/m",
    "/api/v1/series?endpoint=ref/m",
    "/api/v1/probe-series?endpoint=ref/m",
    "/api/v1/alerts",
    "/api/v1/alerts/1",
    "/api/v1/evals",
    "/api/v1/evals/1",
];

/// Every POST route.
const POSTS: &[&str] = &[
    "/alerts/1/ack",
    "/alerts/1/resolve",
    "/api/v1/alerts/1/ack",
    "/api/v1/alerts/1/resolve",
];

#[tokio::test]
async fn no_key_and_non_admin_keys_are_refused_everywhere() -> Result<()> {
    let s = Server::start().await?;
    let http = Server::http()?;
    for path in GETS {
        let none = s.get(path, None).await?;
        if path.starts_with("/api/") {
            ensure!(
                none.status() == 401,
                "{path} without a key: {}",
                none.status()
            );
            let body = body(none).await?;
            ensure!(body["error"]["code"] == "invalid_api_key", "{path}: {body}");
        } else {
            ensure!(
                none.status() == 303,
                "{path} without a key: {}",
                none.status()
            );
            ensure!(none.headers().get("location").and_then(|v| v.to_str().ok()) == Some("/login"));
        }
        let client = s.get(path, Some(&s.client)).await?;
        ensure!(
            client.status() == 403,
            "{path} with a client key: {}",
            client.status()
        );
        if path.starts_with("/api/") {
            let body = body(client).await?;
            ensure!(
                body["error"]["type"] == "permission_error",
                "{path}: {body}"
            );
        } else {
            ensure!(client.text().await?.contains("<p>Forbidden</p>"), "{path}");
        }
        let wrong = s.get(path, Some("sw-not-a-key")).await?;
        ensure!(
            wrong.status() == 401 || wrong.status() == 303,
            "{path} with a wrong key: {}",
            wrong.status()
        );
        let ok = s.get(path, Some(&s.admin)).await?;
        ensure!(
            ok.status() == 200,
            "{path} with the admin key: {}",
            ok.status()
        );
    }
    for path in POSTS {
        let res = http
            .post(format!("{}{path}", s.url))
            .form(&[("csrf", "x")])
            .send()
            .await?;
        ensure!(
            res.status() == 401 || res.status() == 303,
            "POST {path} without a key: {}",
            res.status()
        );
        let res = http
            .post(format!("{}{path}", s.url))
            .bearer_auth(&s.client)
            .form(&[("csrf", "x")])
            .send()
            .await?;
        ensure!(
            res.status() == 403,
            "POST {path} with a client key: {}",
            res.status()
        );
    }
    // nothing changed
    let a = s.db.store.alert(1).await?;
    ensure!(a.is_some_and(|a| a.state.as_str() == "open"));
    s.stop().await
}

#[tokio::test]
async fn login_sets_a_strict_http_only_session_and_csrf_guards_posts() -> Result<()> {
    let s = Server::start().await?;
    let http = Server::http()?;
    // a client key cannot log in; an unknown one neither
    let (status, cookie, _) = s.login(&s.client).await?;
    ensure!(
        status == 403 && cookie.is_none(),
        "client key login: {status}"
    );
    let (status, cookie, _) = s.login("sw-unknown").await?;
    ensure!(status == 401 && cookie.is_none());
    let (status, cookie, raw) = s.login(&s.admin).await?;
    ensure!(status == 303, "admin login: {status}");
    let cookie = cookie.ok_or_else(|| anyhow::anyhow!("no cookie"))?;
    let raw = raw.unwrap_or_default();
    ensure!(
        raw.contains("HttpOnly") && raw.contains("SameSite=Strict") && raw.contains("Path=/"),
        "{raw}"
    );
    ensure!(!raw.contains(&s.admin), "the cookie must not carry the key");

    // the session opens pages; the page carries the CSRF token in its forms
    let page = http
        .get(format!("{}/alerts", s.url))
        .header("cookie", &cookie)
        .send()
        .await?;
    ensure!(page.status() == 200);
    let html = page.text().await?;
    ensure!(
        !html.contains(&s.admin) && !html.contains(&s.client),
        "a key was rendered"
    );
    let hash = samewise_store::hash_key(&s.admin);
    ensure!(!html.contains(&hash), "a key hash was rendered");
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
        .to_owned();
    ensure!(csrf.len() == 64, "csrf token {csrf:?}");

    let id = s.unfaithful_alert;
    // no token, a wrong token: refused, nothing changes
    for form in [vec![], vec![("csrf", "0".repeat(64))]] {
        let res = http
            .post(format!("{}/alerts/{id}/ack", s.url))
            .header("cookie", &cookie)
            .form(&form)
            .send()
            .await?;
        ensure!(
            res.status() == 403,
            "ack without the right CSRF token: {}",
            res.status()
        );
    }
    let res = http
        .post(format!("{}/api/v1/alerts/{id}/ack", s.url))
        .header("cookie", &cookie)
        .header("x-csrf-token", "wrong")
        .send()
        .await?;
    ensure!(res.status() == 403);
    let body = body(res).await?;
    ensure!(body["error"]["code"] == "csrf", "{body}");
    ensure!(
        s.db.store
            .alert(id)
            .await?
            .is_some_and(|a| a.state.as_str() == "open")
    );
    // the right token
    let res = http
        .post(format!("{}/alerts/{id}/ack", s.url))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await?;
    ensure!(res.status() == 303, "ack with the token: {}", res.status());
    ensure!(
        s.db.store
            .alert(id)
            .await?
            .is_some_and(|a| a.state.as_str() == "acknowledged")
    );

    // logout ends the session
    let res = http
        .post(format!("{}/logout", s.url))
        .header("cookie", &cookie)
        .send()
        .await?;
    ensure!(res.status() == 303);
    let after = http
        .get(format!("{}/api/v1/models", s.url))
        .header("cookie", &cookie)
        .send()
        .await?;
    ensure!(after.status() == 401, "after logout: {}", after.status());
    s.stop().await
}
