//! Endpoints as the gateway calls them, for the parts of samewise that call endpoints
//! directly (probes, evals): [`EndpointTarget`] (label, base URL, provider model id, key),
//! built from the configuration by [`Config::endpoint_targets`]; the label format
//! ([`EndpointConfig::id`]) and the provider-key rule ([`ProviderConfig::api_key`]: a named
//! variable that is unset is an error, never "no auth") are the gateway's own, so a probe
//! or an eval reaches exactly what clients reach.

use samewise_store::EndpointId;

use super::{Config, EndpointConfig, ProviderConfig};
use crate::ProxyError;

/// One endpoint as the gateway calls it, for the parts that call endpoints directly (probes,
/// evals): the same base URL, key and provider model id, under the same label.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointTarget {
    /// The logical model (a key of `[models]`).
    pub model: String,
    /// `provider/model-id`, as records and alerts name it.
    pub endpoint: EndpointId,
    /// The provider's OpenAI-compatible base URL (with `/v1`).
    pub base_url: String,
    /// The id the provider knows the model by.
    pub provider_model: String,
    /// The provider's key, from its `api_key_env`; None for keyless providers.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for EndpointTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointTarget")
            .field("model", &self.model)
            .field("endpoint", &self.endpoint)
            .field("base_url", &self.base_url)
            .field("provider_model", &self.provider_model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl EndpointConfig {
    /// The endpoint's label, `provider/model-id`.
    pub fn id(&self) -> EndpointId {
        EndpointId::new(&self.provider, &self.model)
    }
}

impl ProviderConfig {
    /// The provider's key from `api_key_env`, read through `env`; None for a keyless
    /// provider. A named variable that is unset or empty is an error naming it (never a
    /// silent "no auth").
    pub fn api_key(
        &self,
        provider: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<String>, ProxyError> {
        let Some(var) = &self.api_key_env else {
            return Ok(None);
        };
        match env(var).filter(|v| !v.is_empty()) {
            Some(key) => Ok(Some(key)),
            None => Err(ProxyError::MissingProviderKey {
                provider: provider.to_owned(),
                env: var.clone(),
            }),
        }
    }
}

impl Config {
    /// Every endpoint of the models `include` accepts, as the gateway calls it, with provider
    /// keys read from the environment (a missing one is an error, as for the gateway).
    pub fn endpoint_targets(
        &self,
        include: impl Fn(&str) -> bool,
    ) -> Result<Vec<EndpointTarget>, ProxyError> {
        let mut out = Vec::new();
        for (name, model) in self.models.iter().filter(|(n, _)| include(n)) {
            for e in &model.endpoints {
                let p =
                    self.providers
                        .get(&e.provider)
                        .ok_or_else(|| ProxyError::ConfigInvalid {
                            key: format!("models.{name}.endpoints"),
                            line: None,
                            message: format!("names unknown provider \"{}\"", e.provider),
                        })?;
                out.push(EndpointTarget {
                    model: name.clone(),
                    endpoint: e.id(),
                    base_url: p.base_url.clone(),
                    provider_model: e.model.clone(),
                    api_key: p.api_key(&e.provider, |v| std::env::var(v).ok())?,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_PROVIDERS: &str = r#"
[providers.open]
base_url = "http://127.0.0.1:9/v1"
[providers.keyed]
base_url = "http://127.0.0.1:10/v1"
api_key_env = "SAMEWISE_TEST_SURELY_UNSET_KEY"

[models.m]
[[models.m.endpoints]]
provider = "open"
model = "m-1"
[models.other]
[[models.other.endpoints]]
provider = "keyed"
model = "o-1"
"#;

    #[test]
    fn targets_use_the_gateways_label_and_key_rules() -> Result<(), ProxyError> {
        let config = Config::from_toml_str(TWO_PROVIDERS)?;
        let targets = config.endpoint_targets(|m| m == "m")?;
        assert_eq!(targets.len(), 1);
        let t = &targets[0];
        assert_eq!(
            (t.model.as_str(), t.endpoint.as_str(), t.base_url.as_str()),
            ("m", "open/m-1", "http://127.0.0.1:9/v1")
        );
        assert_eq!(
            (t.provider_model.as_str(), t.api_key.as_deref()),
            ("m-1", None)
        );
        // a named key variable that is unset is an error naming it, never "no auth"
        let err = config
            .endpoint_targets(|_| true)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("SAMEWISE_TEST_SURELY_UNSET_KEY")),
            "{err:?}"
        );
        let keyed = &config.providers["keyed"];
        assert_eq!(
            keyed.api_key("keyed", |v| (v == "SAMEWISE_TEST_SURELY_UNSET_KEY")
                .then(|| "sk-1".to_owned()))?,
            Some("sk-1".to_owned())
        );
        assert!(
            keyed.api_key("keyed", |_| Some(String::new())).is_err(),
            "empty is unset"
        );
        // the key never shows in Debug
        let shown = format!(
            "{:?}",
            EndpointTarget {
                api_key: Some("sk-secret".to_owned()),
                ..t.clone()
            }
        );
        assert!(
            !shown.contains("sk-secret") && shown.contains("redacted"),
            "{shown}"
        );
        Ok(())
    }
}
