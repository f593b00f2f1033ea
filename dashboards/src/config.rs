//! The dashboards' configuration: the top-level `[dashboards]` table and each model's
//! `[models.NAME.slo]` table (TTFT and TPOT targets), both handed over raw by the proxy's
//! config and parsed here with `deny_unknown_fields`; errors name the key.
//!
//! ```toml
//! [dashboards]
//! session_ttl_s = 43200     # a login session lasts this long (default 12 h)
//!
//! [models.smol.slo]
//! ttft_ms = 500             # time to first token target
//! tpot_ms = 50              # time per output token target
//! ```

use serde::Deserialize;

use crate::DashError;

/// `[dashboards]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DashboardsConfig {
    /// How long a login session lasts, milliseconds.
    pub session_ttl_ms: i64,
}

impl Default for DashboardsConfig {
    fn default() -> Self {
        DashboardsConfig {
            session_ttl_ms: 12 * 3600 * 1000,
        }
    }
}

/// A model's service-level objective: the targets goodput is measured against.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Slo {
    /// Time to first token target, milliseconds.
    pub ttft_ms: f64,
    /// Time per output token target, milliseconds.
    pub tpot_ms: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDashboards {
    session_ttl_s: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlo {
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
}

impl DashboardsConfig {
    /// Parses the raw `[dashboards]` table (None = defaults).
    pub fn parse(raw: Option<&toml::Table>) -> Result<DashboardsConfig, DashError> {
        let Some(t) = raw else {
            return Ok(DashboardsConfig::default());
        };
        let r: RawDashboards =
            t.clone()
                .try_into()
                .map_err(|e: toml::de::Error| DashError::Config {
                    key: "dashboards".to_owned(),
                    reason: e.message().to_owned(),
                })?;
        let mut c = DashboardsConfig::default();
        if let Some(s) = r.session_ttl_s {
            if s == 0 || s > 30 * 86_400 {
                return Err(DashError::Config {
                    key: "dashboards.session_ttl_s".to_owned(),
                    reason: "must be between 1 and 2592000 (30 days)".to_owned(),
                });
            }
            c.session_ttl_ms = i64::try_from(s * 1000).unwrap_or(i64::MAX);
        }
        Ok(c)
    }
}

impl Slo {
    /// Parses `[models.<model>.slo]` (None = no SLO). Both targets are required and must be
    /// positive and finite.
    pub fn parse(model: &str, raw: Option<&toml::Table>) -> Result<Option<Slo>, DashError> {
        let Some(t) = raw else {
            return Ok(None);
        };
        let key = |k: &str| format!("models.{model}.slo{k}");
        let r: RawSlo = t
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| DashError::Config {
                key: key(""),
                reason: e.message().to_owned(),
            })?;
        let check = |name: &str, v: Option<f64>| match v {
            Some(v) if v.is_finite() && v > 0.0 => Ok(v),
            Some(_) => Err(DashError::Config {
                key: key(&format!(".{name}")),
                reason: "must be a positive number of milliseconds".to_owned(),
            }),
            None => Err(DashError::Config {
                key: key(&format!(".{name}")),
                reason: "is required".to_owned(),
            }),
        };
        Ok(Some(Slo {
            ttft_ms: check("ttft_ms", r.ttft_ms)?,
            tpot_ms: check("tpot_ms", r.tpot_ms)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(s: &str) -> toml::Table {
        s.parse().unwrap_or_default()
    }

    #[test]
    fn slo_parses_and_names_bad_keys() {
        let ok = Slo::parse("m", Some(&table("ttft_ms = 500\ntpot_ms = 40.5")));
        assert!(
            matches!(ok, Ok(Some(Slo { ttft_ms, tpot_ms })) if ttft_ms == 500.0 && tpot_ms == 40.5)
        );
        assert!(matches!(Slo::parse("m", None), Ok(None)));
        let e = Slo::parse("m", Some(&table("ttft_ms = -1\ntpot_ms = 5")));
        assert!(matches!(e, Err(DashError::Config { key, .. }) if key == "models.m.slo.ttft_ms"));
        let e = Slo::parse("m", Some(&table("ttft_ms = 1")));
        assert!(matches!(e, Err(DashError::Config { key, .. }) if key == "models.m.slo.tpot_ms"));
        let e = Slo::parse("m", Some(&table("ttft = 1")));
        assert!(
            matches!(e, Err(DashError::Config { key, reason }) if key == "models.m.slo" && reason.contains("ttft"))
        );
    }

    #[test]
    fn dashboards_section() {
        assert_eq!(
            DashboardsConfig::parse(None).ok(),
            Some(DashboardsConfig::default())
        );
        let c = DashboardsConfig::parse(Some(&table("session_ttl_s = 60")));
        assert_eq!(c.ok().map(|c| c.session_ttl_ms), Some(60_000));
        assert!(DashboardsConfig::parse(Some(&table("session_ttl_s = 0"))).is_err());
        assert!(DashboardsConfig::parse(Some(&table("nope = 1"))).is_err());
    }
}
