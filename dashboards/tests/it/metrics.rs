//! The dashboards' Prometheus families in one shared registry: after a refresh they hold the
//! latest probe statistics, probe runs by outcome, active alerts by kind, routing state and
//! goodput, with bounded labels.

use anyhow::{Result, ensure};
use prometheus_client::registry::Registry;
use samewise_dashboards::DashMetrics;

use crate::common::{RUNS, Server};

#[tokio::test]
async fn refreshed_families_hold_the_store_values() -> Result<()> {
    let s = Server::start().await?;
    let mut registry = Registry::with_prefix("samewise");
    let m = DashMetrics::register(&mut registry);
    m.refresh(&s.dash).await?;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    // the newest w4 run: kl 0.08 × 1.5
    let kl = text
        .lines()
        .find(|l| {
            l.starts_with("samewise_probe_statistic{")
                && l.contains("endpoint=\"w4/m\"")
                && l.contains("stat=\"kl_mean\"")
        })
        .unwrap_or_default();
    let v: f64 = kl
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .parse()
        .unwrap_or(-1.0);
    ensure!((v - 0.08 * 1.5).abs() < 1e-9, "{kl}");
    // the tool_calls probe's schema accuracy
    ensure!(
        text.contains("samewise_probe_statistic{model=\"m\",endpoint=\"tool/m\",kind=\"tool_calls\",stat=\"schema_accuracy\"} 0.72"),
        "{text}"
    );
    ensure!(
        text.contains(&format!(
            "samewise_probe_runs_total{{model=\"m\",endpoint=\"w4/m\",kind=\"prompt_logprobs\",outcome=\"ok\"}} {RUNS}"
        )),
        "{text}"
    );
    ensure!(
        text.contains("samewise_alerts_active{model=\"m\",kind=\"unfaithful\",state=\"open\"} 1")
    );
    ensure!(text.contains(
        "samewise_endpoint_routing_state{model=\"m\",endpoint=\"w4/m\",state=\"demoted\"} 1"
    ));
    ensure!(text.contains(
        "samewise_endpoint_routing_state{model=\"m\",endpoint=\"w4/m\",state=\"active\"} 0"
    ));
    // goodput over the last hour: the fixture's attempts are 21..60 minutes old
    ensure!(
        text.contains("samewise_goodput_ratio{model=\"m\",endpoint=\"ref/m\"}"),
        "{text}"
    );
    ensure!(!text.contains("<script>"), "a payload in a label");
    s.stop().await
}
