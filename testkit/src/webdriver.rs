//! A tiny W3C WebDriver client over `reqwest`, enough for browser tests of the dashboards:
//! [`ChromeDriver`] starts Debian's `chromedriver --port=N` (killed when dropped, with the
//! browsers it started: a failing test leaves no Chromium behind), and
//! [`Browser`] is one headless Chromium session (navigate, find by CSS, text, click, type,
//! run a script, read the browser console log, take a screenshot).
//!
//! Chromium runs with `--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
//! --disable-background-networking --disable-component-update --disable-sync` and its own
//! `--user-data-dir`, so it contacts nothing but the pages it is sent to; the console log is
//! captured through `goog:loggingPrefs` (all levels).
//!
//! [`ChromeDriver`]: crate::webdriver::ChromeDriver
//! [`Browser`]: crate::webdriver::Browser

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::TestkitError;

/// The W3C element-reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn err(msg: impl Into<String>) -> TestkitError {
    TestkitError::WebDriver(msg.into())
}

/// A running `chromedriver`, killed when dropped.
#[derive(Debug)]
pub struct ChromeDriver {
    child: Child,
    url: String,
}

impl ChromeDriver {
    /// Starts `chromedriver` on a free local port and waits until it is ready (30 s).
    pub async fn start() -> Result<ChromeDriver, TestkitError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| err(format!("no free port: {e}")))?
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            // a process group of its own, which the browsers it starts join: dropping the
            // driver kills them all, even when a failing test never quit its session
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                err(format!(
                    "cannot start chromedriver (apt-get install chromium-driver): {e}"
                ))
            })?;
        let driver = ChromeDriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(format!("{}/status", driver.url)).send().await
                && r.status().is_success()
            {
                return Ok(driver);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(err("chromedriver did not become ready within 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new headless Chromium session with its profile in `user_data_dir`.
    pub async fn browser(&self, user_data_dir: &Path) -> Result<Browser, TestkitError> {
        let http = reqwest::Client::new();
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                format!("--user-data-dir={}", user_data_dir.display()),
            ]},
            "goog:loggingPrefs": { "browser": "ALL" },
        }}});
        let v = call(
            &http,
            reqwest::Method::POST,
            &format!("{}/session", self.url),
            Some(caps),
        )
        .await?;
        let id = v["sessionId"]
            .as_str()
            .ok_or_else(|| err(format!("no session id in {v}")))?
            .to_owned();
        Ok(Browser {
            http,
            base: format!("{}/session/{id}", self.url),
        })
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session. Call [`Browser::quit`] to close it (the driver's drop kills it too).
#[derive(Debug)]
pub struct Browser {
    http: reqwest::Client,
    base: String,
}

/// A WebDriver command: JSON in, the answer's `value` out; errors carry the driver's message.
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, TestkitError> {
    let mut req = http.request(method, url);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let res = req.send().await.map_err(|e| err(format!("{url}: {e}")))?;
    let status = res.status();
    let text = res.text().await.map_err(|e| err(format!("{url}: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| err(format!("{url}: {e}: {text}")))?;
    if !status.is_success() {
        return Err(err(format!("{url}: {status}: {}", v["value"])));
    }
    Ok(v["value"].clone())
}

impl Browser {
    async fn cmd(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, TestkitError> {
        call(&self.http, method, &format!("{}{path}", self.base), body).await
    }

    /// Navigates to `url` and waits for the load.
    pub async fn goto(&self, url: &str) -> Result<(), TestkitError> {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await?;
        Ok(())
    }

    /// The current URL.
    pub async fn url(&self) -> Result<String, TestkitError> {
        Ok(self
            .cmd(reqwest::Method::GET, "/url", None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// The first element matching the CSS `selector`.
    pub async fn find(&self, selector: &str) -> Result<String, TestkitError> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": selector })),
            )
            .await?;
        v[ELEMENT]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| err(format!("no element for {selector}: {v}")))
    }

    /// Every element matching `selector`.
    pub async fn find_all(&self, selector: &str) -> Result<Vec<String>, TestkitError> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": selector })),
            )
            .await?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
            .collect())
    }

    /// The rendered text of element `el`.
    pub async fn text(&self, el: &str) -> Result<String, TestkitError> {
        Ok(self
            .cmd(reqwest::Method::GET, &format!("/element/{el}/text"), None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// An attribute of element `el`.
    pub async fn attr(&self, el: &str, name: &str) -> Result<Option<String>, TestkitError> {
        Ok(self
            .cmd(
                reqwest::Method::GET,
                &format!("/element/{el}/attribute/{name}"),
                None,
            )
            .await?
            .as_str()
            .map(str::to_owned))
    }

    /// Clicks element `el`.
    pub async fn click(&self, el: &str) -> Result<(), TestkitError> {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await?;
        Ok(())
    }

    /// Types `text` into element `el`.
    pub async fn type_into(&self, el: &str, text: &str) -> Result<(), TestkitError> {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({ "text": text })),
        )
        .await?;
        Ok(())
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its result.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value, TestkitError> {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// The page's HTML as the browser holds it.
    pub async fn source(&self) -> Result<String, TestkitError> {
        Ok(self
            .cmd(reqwest::Method::GET, "/source", None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// The browser console entries since the last call (`level`, `message`, `timestamp`).
    pub async fn console(&self) -> Result<Vec<Value>, TestkitError> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({ "type": "browser" })),
            )
            .await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// A PNG screenshot of the viewport.
    pub async fn screenshot(&self) -> Result<Vec<u8>, TestkitError> {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await?;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .map_err(|e| err(format!("screenshot: {e}")))
    }

    /// Sets the window size (to look at a page as a phone would).
    pub async fn resize(&self, width: u32, height: u32) -> Result<(), TestkitError> {
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        )
        .await?;
        Ok(())
    }

    /// Ends the session (closes the browser).
    pub async fn quit(self) -> Result<(), TestkitError> {
        self.cmd(reqwest::Method::DELETE, "", None).await?;
        Ok(())
    }
}
