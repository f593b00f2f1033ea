//! Cross-origin calls from browsers to the OpenAI routes (`/v1/...`), allowed for the origins
//! of `[server] cors_allow_origins` (none by default: then no response carries a CORS header,
//! and a browser's preflight gets the 405 any `OPTIONS` gets).
//!
//! What a browser page calling the gateway needs, as vLLM and LiteLLM answer it: a preflight
//! (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered here, before any
//! route or key check (a preflight carries no key), with the methods the routes take and the
//! request headers the page asked for, echoed (a client SDK sends headers of its own beside
//! `Authorization`, which the `*` wildcard of `Access-Control-Allow-Headers` never covers);
//! every other answer to an allowed origin carries `Access-Control-Allow-Origin` and exposes
//! the gateway's own headers (`x-request-id`, `x-samewise-endpoint`, `retry-after`). Keys are
//! bearer tokens, never cookies, so no credentials are allowed and `*` exposes nothing a page
//! could use without its own key. The dashboards (cookie sessions, `/`, `/api/v1/...`) are
//! never cross-origin.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The response headers a page may read beside the CORS-safelisted ones.
const EXPOSED: &str = "x-request-id, x-samewise-endpoint, retry-after";
/// The methods of the OpenAI routes.
const METHODS: &str = "GET, POST";
/// How long a browser may keep a preflight's answer, in seconds (Chromium keeps at most 7,200).
const MAX_AGE: &str = "7200";

/// The origins allowed to call the OpenAI routes from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cors {
    /// Every origin (`"*"` in the list).
    Any,
    /// These origins (`scheme://host[:port]`, lower case), compared with a request's `Origin`
    /// ignoring ASCII case.
    Only(Vec<String>),
}

impl Cors {
    /// `[server] cors_allow_origins` checked: None for an empty list, [`Cors::Any`] when it
    /// holds `"*"`; each other entry must be an origin as a browser sends it
    /// (`https://app.example.com`, `http://localhost:3000`: a scheme, a host and a port, no path),
    /// or the error says which entry is not and why.
    pub fn from_list(list: &[String]) -> Result<Option<Cors>, (usize, String)> {
        let mut only = Vec::with_capacity(list.len());
        for (i, o) in list.iter().enumerate() {
            if o == "*" {
                return Ok(Some(Cors::Any));
            }
            only.push(origin(o).map_err(|why| (i, why))?);
        }
        Ok((!only.is_empty()).then_some(Cors::Only(only)))
    }

    /// Whether a request to `path` is one this answers for: the OpenAI routes.
    pub fn covers(path: &str) -> bool {
        path.starts_with("/v1/")
    }

    /// What `Access-Control-Allow-Origin` says to a request from `origin`, if it is allowed.
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            Cors::Any => Some(HeaderValue::from_static("*")),
            Cors::Only(list) => {
                let o = origin.to_str().ok()?;
                list.iter()
                    .any(|a| a.eq_ignore_ascii_case(o))
                    .then(|| origin.clone())
            }
        }
    }

    /// The answer to a preflight, when `method` and `headers` make one; None for any other
    /// request. A preflight from an origin not allowed gets an OpenAI-shaped 403 without CORS
    /// headers (the browser then refuses the call; `curl` shows why).
    pub fn preflight(&self, method: &Method, headers: &HeaderMap) -> Option<Response> {
        if method != Method::OPTIONS {
            return None;
        }
        let origin = headers.get(header::ORIGIN)?;
        headers.get(header::ACCESS_CONTROL_REQUEST_METHOD)?;
        let Some(allowed) = self.allow(origin) else {
            let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
            return Some(ApiError::OriginNotAllowed { origin }.into_response());
        };
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        let h = resp.headers_mut();
        self.vary(h, true);
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        if let Some(asked) = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE),
        );
        Some(resp)
    }

    /// Marks `resp`, the answer to a request from `origin`, as readable by that origin's pages
    /// (nothing when the origin is not allowed).
    pub fn expose(&self, origin: &HeaderValue, resp: &mut Response) {
        let Some(allowed) = self.allow(origin) else {
            return;
        };
        let h = resp.headers_mut();
        self.vary(h, false);
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED),
        );
    }

    /// `Vary`, so that a cache between browser and gateway keeps one origin's answer from
    /// another: the origin matters unless every origin gets `*`, and a preflight's answer
    /// also depends on what it asked.
    fn vary(&self, h: &mut HeaderMap, preflight: bool) {
        let v = match (self, preflight) {
            (Cors::Any, false) => return,
            (Cors::Any, true) => "Access-Control-Request-Headers",
            (Cors::Only(_), false) => "Origin",
            (Cors::Only(_), true) => "Origin, Access-Control-Request-Headers",
        };
        h.append(header::VARY, HeaderValue::from_static(v));
    }
}

/// `o` as an origin to compare with (lower case), or why it is not one.
fn origin(o: &str) -> Result<String, String> {
    let lower = o.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("{o:?} is not an origin: it must start with http:// or https:// (or be \"*\")")
        })?;
    if rest.is_empty() {
        return Err(format!("{o:?} has no host"));
    }
    if rest.contains(['/', '?', '#']) {
        return Err(format!(
            "{o:?} is not an origin: a browser sends scheme, host and port only, \
             without a path or a trailing slash"
        ));
    }
    if rest.contains(|c: char| c.is_whitespace() || c.is_control() || c == '@') {
        return Err(format!(
            "{o:?} is not an origin: its host is not a host name"
        ));
    }
    if let Some((_, port)) = rest.rsplit_once(':')
        && !rest.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Err(format!("{o:?} has a port that is not a number up to 65535"));
    }
    Ok(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Result<Option<Cors>, (usize, String)> {
        Cors::from_list(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn the_list_is_checked_entry_by_entry() {
        assert_eq!(list(&[]).unwrap(), None);
        assert_eq!(list(&["https://a.example", "*"]).unwrap(), Some(Cors::Any));
        assert_eq!(
            list(&[
                "HTTPS://App.Example.com",
                "http://localhost:3000",
                "http://[::1]:8000"
            ])
            .unwrap(),
            Some(Cors::Only(vec![
                "https://app.example.com".into(),
                "http://localhost:3000".into(),
                "http://[::1]:8000".into()
            ]))
        );
        for (bad, why) in [
            ("app.example.com", "must start with http://"),
            ("https://app.example.com/", "without a path"),
            ("https://app.example.com/chat", "without a path"),
            ("https://", "has no host"),
            ("http://localhost:99999", "port"),
            ("http://localhost:x", "port"),
            ("http://user@host", "not a host name"),
        ] {
            let (i, e) = list(&["http://ok.example", bad]).unwrap_err();
            assert_eq!(i, 1, "{bad}");
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn an_origin_is_allowed_ignoring_case_and_echoed_as_sent() {
        let only = list(&["https://app.example.com"]).unwrap().unwrap();
        let sent = HeaderValue::from_static("https://APP.example.com");
        assert_eq!(only.allow(&sent), Some(sent.clone()));
        assert_eq!(
            only.allow(&HeaderValue::from_static("https://app.example.com.evil")),
            None
        );
        assert_eq!(only.allow(&HeaderValue::from_static("null")), None);
        assert_eq!(
            Cors::Any.allow(&HeaderValue::from_static("null")),
            Some(HeaderValue::from_static("*"))
        );
        assert!(Cors::covers("/v1/chat/completions"));
        assert!(!Cors::covers("/api/v1/alerts"));
        assert!(!Cors::covers("/v1"));
    }
}
