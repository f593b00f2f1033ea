//! `[models.NAME.capture]`: the opt-in, bounded store of flagged requests' bodies of one
//! model (off by default), read here and checked with errors that name the key and line.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::Validator;
use crate::ProxyError;

/// `[models.NAME.capture]`, checked: the opt-in, bounded body store of one model.
///
/// ```toml
/// [models.smol.capture]
/// enabled = true          # default false: nothing is kept
/// max_bytes = 67108864    # the model's stored bodies at most (oldest evicted); 64 MiB
/// max_age_hours = 168     # each body is deleted after this long; 7 days (at most 90 days)
/// max_body_bytes = 262144 # a larger request + answer is not kept; 256 KiB
/// sample = 0.0            # fraction of unflagged requests kept too
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaptureConfig {
    /// Bytes of the model's stored bodies at most (the oldest are evicted beyond).
    pub max_bytes: u64,
    /// How long a body is kept.
    pub max_age: Duration,
    /// The largest request + answer kept (a bigger one is not captured).
    pub max_body_bytes: usize,
    /// Fraction of all requests kept even when not flagged.
    pub sample: f64,
}

/// Default `max_bytes`: 64 MiB per model.
pub const CAPTURE_MAX_BYTES: u64 = 64 << 20;
/// Default `max_age_hours`: 7 days.
pub const CAPTURE_MAX_AGE_HOURS: u64 = 168;
/// Default `max_body_bytes`: 256 KiB.
pub const CAPTURE_MAX_BODY_BYTES: u64 = 256 << 10;
/// The longest `max_age_hours`: 90 days.
pub const CAPTURE_AGE_LIMIT_HOURS: u64 = 90 * 24;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCapture {
    #[serde(default)]
    enabled: bool,
    max_bytes: Option<u64>,
    max_age_hours: Option<u64>,
    max_body_bytes: Option<u64>,
    sample: Option<f64>,
}

impl Validator<'_> {
    /// `[models.NAME.capture]`: None unless enabled; bounds checked against each other.
    pub(super) fn capture(
        &self,
        name: &str,
        raw: Spanned<RawCapture>,
    ) -> Result<Option<CaptureConfig>, ProxyError> {
        let span = Some(raw.span());
        let raw = raw.into_inner();
        let key = |k: &str| format!("models.{name}.capture.{k}");
        let max_bytes = raw.max_bytes.unwrap_or(CAPTURE_MAX_BYTES);
        let max_body_bytes = raw.max_body_bytes.unwrap_or(CAPTURE_MAX_BODY_BYTES);
        let hours = raw.max_age_hours.unwrap_or(CAPTURE_MAX_AGE_HOURS);
        let sample = raw.sample.unwrap_or(0.0);
        if max_body_bytes == 0 {
            return self.err(key("max_body_bytes"), span, "must be greater than 0");
        }
        if max_bytes < max_body_bytes {
            return self.err(
                key("max_bytes"),
                span,
                format!("must be at least max_body_bytes ({max_body_bytes})"),
            );
        }
        if !(1..=CAPTURE_AGE_LIMIT_HOURS).contains(&hours) {
            return self.err(
                key("max_age_hours"),
                span,
                format!("must be in 1..={CAPTURE_AGE_LIMIT_HOURS} (90 days), not {hours}"),
            );
        }
        if !(0.0..=1.0).contains(&sample) {
            return self.err(key("sample"), span, "must be a fraction in [0, 1]");
        }
        if !raw.enabled {
            return Ok(None);
        }
        Ok(Some(CaptureConfig {
            max_bytes,
            max_age: Duration::from_secs(hours * 3600),
            max_body_bytes: usize::try_from(max_body_bytes).unwrap_or(usize::MAX),
            sample,
        }))
    }
}
