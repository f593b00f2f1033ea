//! `[retention]`: how many days the store keeps request records, rollups (with the probe runs)
//! and the probe runs' per-position data (whole UTC days; 0 keeps them for ever). The store's
//! [`RetentionConfig`] is what the gateway runs with.

use std::time::Duration;

use samewise_store::RetentionConfig;
use serde::Deserialize;
use toml::Spanned;

use super::Validator;
use crate::ProxyError;

/// The most days a `[retention]` key may say (100 years; 0 says "for ever").
pub const MAX_RETENTION_DAYS: u64 = 36_500;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetention {
    records_days: Option<Spanned<u64>>,
    rollups_days: Option<Spanned<u64>>,
    probe_raw_days: Option<Spanned<u64>>,
}

impl Validator<'_> {
    pub(super) fn retention(&self, raw: RawRetention) -> Result<RetentionConfig, ProxyError> {
        let d = RetentionConfig::default();
        Ok(RetentionConfig {
            records: self.days("retention.records_days", raw.records_days, d.records)?,
            rollups: self.days("retention.rollups_days", raw.rollups_days, d.rollups)?,
            probe_raw: self.days("retention.probe_raw_days", raw.probe_raw_days, d.probe_raw)?,
            ..d
        })
    }

    /// A `*_days` key: 0 is `None` (kept for ever), absent is `default`.
    fn days(
        &self,
        key: &str,
        v: Option<Spanned<u64>>,
        default: Option<Duration>,
    ) -> Result<Option<Duration>, ProxyError> {
        match v {
            None => Ok(default),
            Some(s) if *s.get_ref() == 0 => Ok(None),
            Some(s) if *s.get_ref() > MAX_RETENTION_DAYS => self.err(
                key,
                Some(s.span()),
                format!(
                    "must be at most {MAX_RETENTION_DAYS} days (0 keeps them for ever), not {}",
                    s.get_ref()
                ),
            ),
            Some(s) => Ok(Some(Duration::from_secs(*s.get_ref() * 86_400))),
        }
    }
}
