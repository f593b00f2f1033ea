//! Opening jobs: the one check of what a job names (endpoint, suite, baseline) and the one
//! builder of its row, shared by `samewise evals run`, `POST /api/v1/evals` and the alert
//! watcher, so that they accept and refuse the same things with the same words.
//!
//! A job on a customer suite carries its items in `params.custom` (name, source, items): any
//! worker on the shared queue runs exactly the items that were checked when it was opened,
//! whatever its own files say.

use std::collections::BTreeMap;
use std::path::PathBuf;

use samewise_store::{EvalJob, NewEvalJob, Store};
use serde_json::{Value, json};

use crate::target::REFERENCE;
use crate::{EvalsConfig, EvalsError};

/// Which suite a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuiteRef {
    /// A built-in suite or one named in `[evals.suites]`.
    Named(String),
    /// A one-off customer suite read from this file now (the CLI's `--suite-file`).
    File(PathBuf),
}

/// What a caller asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRequest {
    /// The suspect endpoint (`provider/model-id`).
    pub endpoint: String,
    /// The suite.
    pub suite: SuiteRef,
    /// "reference" or a peer endpoint; None: "reference".
    pub baseline: Option<String>,
    /// Extra job parameters (`max_items`, `delta`, `window`, ...) and `opened_by`.
    pub params: serde_json::Map<String, Value>,
    /// The alert that opened it.
    pub alert_id: Option<i64>,
}

/// Opens jobs against the configured endpoints.
#[derive(Debug, Clone)]
pub struct Opener {
    config: EvalsConfig,
    /// Endpoint label → its logical model.
    endpoints: BTreeMap<String, String>,
}

impl Opener {
    /// An opener over `config`, with the configured `endpoints` as (label, model).
    pub fn new(
        config: EvalsConfig,
        endpoints: impl IntoIterator<Item = (String, String)>,
    ) -> Opener {
        let mut map = BTreeMap::new();
        for (label, model) in endpoints {
            // the first model that lists an endpoint owns it (as the gateway routes)
            map.entry(label).or_insert(model);
        }
        Opener {
            config,
            endpoints: map,
        }
    }

    /// The config it checks against.
    pub fn config(&self) -> &EvalsConfig {
        &self.config
    }

    /// The configured endpoint labels.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.endpoints.keys().map(String::as_str)
    }

    /// The other configured endpoints of `endpoint`'s model, by label (none for an unknown one).
    pub fn peers<'a>(&'a self, endpoint: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let model = self.endpoints.get(endpoint);
        self.endpoints
            .iter()
            .filter(move |(label, m)| Some(*m) == model && label.as_str() != endpoint)
            .map(|(label, _)| label.as_str())
    }

    /// Checks `req` and builds the job's row (`now_ms` its creation time).
    pub fn prepare(&self, req: &OpenRequest, now_ms: i64) -> Result<NewEvalJob, EvalsError> {
        let model = self
            .endpoints
            .get(&req.endpoint)
            .ok_or_else(|| EvalsError::UnknownEndpoint {
                name: req.endpoint.clone(),
                known: self
                    .endpoints
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?
            .clone();
        let baseline = req.baseline.clone().unwrap_or_else(|| REFERENCE.to_owned());
        if baseline == REFERENCE {
            if self.config.reference_url.is_none() {
                return Err(EvalsError::UnknownBaseline(
                    "baseline \"reference\" needs [evals] reference_url (or [probes.reference] url)"
                        .to_owned(),
                ));
            }
        } else if !self.endpoints.contains_key(&baseline) {
            return Err(EvalsError::UnknownBaseline(format!(
                "unknown baseline {baseline:?} (\"reference\" or a configured endpoint: {})",
                self.endpoints
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        } else if baseline == req.endpoint {
            return Err(EvalsError::UnknownBaseline(format!(
                "the baseline {baseline:?} is the endpoint itself"
            )));
        }
        let mut params = req.params.clone();
        let suite = match &req.suite {
            SuiteRef::Named(name)
                if crate::config::KNOWN_SUITES.contains(&name.as_str())
                    || crate::config::is_regression(name) =>
            {
                name.clone()
            }
            SuiteRef::Named(name) => {
                let s = self
                    .config
                    .suites
                    .get(name)
                    .ok_or_else(|| EvalsError::UnknownSuite {
                        name: name.clone(),
                        known: self.config.suite_names().join(", "),
                    })?;
                params.insert(
                    "custom".to_owned(),
                    json!({"name": name, "source": s.path.display().to_string(), "items": s.items}),
                );
                name.clone()
            }
            SuiteRef::File(path) => {
                let s = crate::custom::load(path)?;
                let file = path
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "suite".to_owned());
                let name = format!("file:{file}");
                params.insert(
                    "custom".to_owned(),
                    json!({"name": name, "source": path.display().to_string(), "items": s.sources()}),
                );
                name
            }
        };
        Ok(NewEvalJob {
            model,
            endpoint: req.endpoint.clone(),
            suite,
            baseline,
            alert_id: req.alert_id,
            params: Value::Object(params),
            max_attempts: self.config.max_attempts,
            now_ms,
        })
    }

    /// Checks `req` and enqueues the job, unless one of the same endpoint and suite was
    /// opened less than `cooldown_ms` ago (then None). A regression suite's job carries the
    /// model's cases as they are now (`params.custom`), like a customer suite's.
    pub async fn open(
        &self,
        store: &Store,
        req: &OpenRequest,
        cooldown_ms: i64,
    ) -> Result<Option<EvalJob>, EvalsError> {
        let mut job = self.prepare(req, samewise_store::now_ms())?;
        if crate::config::is_regression(&job.suite) {
            let items = crate::capture::items(store, &job.model, &job.suite).await?;
            if let Some(p) = job.params.as_object_mut() {
                p.insert(
                    "custom".to_owned(),
                    json!({
                        "name": job.suite,
                        "source": format!("regression cases of model {}", job.model),
                        "items": items,
                    }),
                );
            }
        }
        Ok(store.enqueue_eval_job(&job, cooldown_ms).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opener(reference: bool) -> Opener {
        let t: toml::Table = if reference {
            "reference_url = \"http://r:1\"".parse().unwrap_or_default()
        } else {
            toml::Table::new()
        };
        let cfg = EvalsConfig::parse(Some(&t), None).unwrap_or_else(|e| panic!("{e}"));
        Opener::new(
            cfg,
            [
                ("a/m".to_owned(), "m".to_owned()),
                ("b/m".to_owned(), "m".to_owned()),
            ],
        )
    }

    fn req(endpoint: &str, suite: &str, baseline: Option<&str>) -> OpenRequest {
        OpenRequest {
            endpoint: endpoint.to_owned(),
            suite: SuiteRef::Named(suite.to_owned()),
            baseline: baseline.map(str::to_owned),
            params: serde_json::Map::new(),
            alert_id: None,
        }
    }

    #[test]
    fn names_are_checked_with_the_callers_words() {
        let o = opener(true);
        let j = o.prepare(&req("a/m", "tool_calls", None), 5);
        let j = j.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((j.model.as_str(), j.baseline.as_str()), ("m", "reference"));
        assert!(o.prepare(&req("a/m", "tool_calls", Some("b/m")), 5).is_ok());
        let e = |r: OpenRequest, o: &Opener| o.prepare(&r, 5).err().map(|e| e.to_string());
        assert_eq!(
            e(req("z/m", "tool_calls", None), &o).as_deref(),
            Some("unknown endpoint \"z/m\" (configured: a/m, b/m)")
        );
        assert_eq!(
            e(req("a/m", "nope", None), &o).as_deref(),
            Some("unknown suite \"nope\" (known: tool_calls, long_context, regression)")
        );
        assert!(
            e(req("a/m", "tool_calls", Some("z/m")), &o)
                .is_some_and(|m| m.starts_with("unknown baseline \"z/m\""))
        );
        assert!(
            e(req("a/m", "tool_calls", Some("a/m")), &o)
                .is_some_and(|m| m.contains("is the endpoint itself"))
        );
        assert!(
            e(req("a/m", "tool_calls", None), &opener(false))
                .is_some_and(|m| m.contains("needs [evals] reference_url"))
        );
    }
}
