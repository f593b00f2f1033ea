//! Alerts: dedupe per model+endpoint+kind, ack, resolve, re-open after resolve, auto-resolve
//! of quiet alerts, the active set, filters.

use super::*;
use anyhow::Context;
use samewise_store::{AlertQuery, AlertState, NewAlert, Resolver};

both!(
    alert_lifecycle_and_dedupe,
    alert_auto_resolve_and_filters,
    alert_resolver_and_the_last_operator_resolution,
    alert_confirmation_restarts_the_quiet_period,
    alert_concurrent_upserts
);

fn finding(endpoint: &str, kind: &str, now_ms: i64, kl: f64) -> NewAlert {
    NewAlert {
        model: "smollm2".to_owned(),
        endpoint: endpoint.to_owned(),
        kind: kind.to_owned(),
        summary: format!("endpoint {endpoint}: mean KL {kl}"),
        evidence: serde_json::json!({"statistic": "kl_mean", "value": kl, "threshold": 0.12, "probe_runs": [1, 2]}),
        now_ms,
    }
}

async fn alert_lifecycle_and_dedupe(db: TestDb) -> Result<()> {
    let (a, new) = db
        .store
        .upsert_alert(&finding("p/b", "unfaithful", 1_000, 0.4))
        .await?;
    ensure!(new, "first finding did not open an alert");
    ensure!(a.state == AlertState::Open && a.opened_ms == 1_000 && a.last_seen_ms == 1_000);
    ensure!(a.resolved_ms.is_none() && a.evidence["value"] == 0.4);
    // same endpoint+kind again: refreshed, not duplicated
    let (b, new) = db
        .store
        .upsert_alert(&finding("p/b", "unfaithful", 2_000, 0.5))
        .await?;
    ensure!(
        !new && b.id == a.id,
        "deduplication failed: {a:?} then {b:?}"
    );
    ensure!(b.opened_ms == 1_000 && b.last_seen_ms == 2_000 && b.evidence["value"] == 0.5);
    ensure!(b.summary.contains("0.5"));
    // another kind or endpoint is another alert
    let (c, new) = db
        .store
        .upsert_alert(&finding("p/b", "changed", 2_000, 0.5))
        .await?;
    ensure!(new && c.id != a.id);
    let (d, new) = db
        .store
        .upsert_alert(&finding("p/c", "unfaithful", 2_000, 0.5))
        .await?;
    ensure!(new && d.id != a.id && d.id != c.id);
    ensure!(db.store.active_alerts().await?.len() == 3);
    // ack keeps it active and deduplicating
    let acked = db.store.ack_alert(a.id).await?.context("ack: no alert")?;
    ensure!(acked.state == AlertState::Acknowledged);
    let acked_again = db.store.ack_alert(a.id).await?.context("ack twice")?;
    ensure!(acked_again.state == AlertState::Acknowledged);
    let (e, new) = db
        .store
        .upsert_alert(&finding("p/b", "unfaithful", 3_000, 0.6))
        .await?;
    ensure!(!new && e.id == a.id && e.state == AlertState::Acknowledged);
    ensure!(db.store.active_alerts().await?.iter().any(|x| x.id == a.id));
    // resolve: inactive, and the next finding opens a NEW alert
    let resolved = db
        .store
        .resolve_alert(a.id)
        .await?
        .context("resolve: no alert")?;
    ensure!(resolved.state == AlertState::Resolved && resolved.resolved_ms.is_some());
    ensure!(resolved.resolved_by == Some(Resolver::Operator) && acked.resolved_by.is_none());
    ensure!(resolved.to_json()["resolved_by"] == "operator");
    let again = db
        .store
        .resolve_alert(a.id)
        .await?
        .context("resolve twice")?;
    ensure!(again.state == AlertState::Resolved && again.resolved_ms == resolved.resolved_ms);
    // acking a resolved alert does not revive it
    ensure!(db.store.ack_alert(a.id).await?.map(|x| x.state) == Some(AlertState::Resolved));
    ensure!(!db.store.active_alerts().await?.iter().any(|x| x.id == a.id));
    let (f, new) = db
        .store
        .upsert_alert(&finding("p/b", "unfaithful", 4_000, 0.7))
        .await?;
    ensure!(new && f.id != a.id && f.state == AlertState::Open && f.opened_ms == 4_000);
    // unknown ids
    ensure!(db.store.ack_alert(999_999).await?.is_none());
    ensure!(db.store.resolve_alert(999_999).await?.is_none());
    ensure!(db.store.alert(999_999).await?.is_none());
    ensure!(db.store.alert(f.id).await? == Some(f.clone()));
    // bad input
    let bad = db
        .store
        .upsert_alert(&finding("", "unfaithful", 1, 0.1))
        .await;
    ensure!(matches!(bad, Err(StoreError::InvalidInput(_))), "{bad:?}");
    Ok(())
}

async fn alert_auto_resolve_and_filters(db: TestDb) -> Result<()> {
    let (old, _) = db
        .store
        .upsert_alert(&finding("p/a", "unfaithful", 1_000, 0.3))
        .await?;
    let (fresh, _) = db
        .store
        .upsert_alert(&finding("p/b", "unfaithful", 1_000, 0.3))
        .await?;
    let (acked, _) = db
        .store
        .upsert_alert(&finding("p/c", "passive", 1_500, 0.3))
        .await?;
    db.store.ack_alert(acked.id).await?;
    // p/b seen again later: not quiet
    db.store
        .upsert_alert(&finding("p/b", "unfaithful", 5_000, 0.3))
        .await?;
    let quiet = db.store.resolve_quiet_alerts(4_000).await?;
    let ids: Vec<i64> = quiet.iter().map(|a| a.id).collect();
    ensure!(ids == [old.id, acked.id], "auto-resolved {ids:?}");
    ensure!(
        quiet
            .iter()
            .all(|a| a.state == AlertState::Resolved && a.resolved_by == Some(Resolver::Quiet))
    );
    ensure!(
        db.store.resolve_quiet_alerts(4_000).await?.is_empty(),
        "resolved twice"
    );
    let active = db.store.active_alerts().await?;
    ensure!(active.len() == 1 && active[0].id == fresh.id, "{active:?}");
    // filters, newest first
    let q = |state, endpoint: Option<&str>, limit| AlertQuery {
        state,
        active_only: false,
        model: None,
        endpoint: endpoint.map(str::to_owned),
        limit,
    };
    let ids = |v: Vec<samewise_store::Alert>| v.iter().map(|a| a.id).collect::<Vec<_>>();
    ensure!(ids(db.store.alerts(&q(None, None, 100)).await?) == [acked.id, fresh.id, old.id]);
    ensure!(
        ids(db
            .store
            .alerts(&q(Some(AlertState::Resolved), None, 100))
            .await?)
            == [acked.id, old.id]
    );
    ensure!(
        ids(db
            .store
            .alerts(&q(Some(AlertState::Open), None, 100))
            .await?)
            == [fresh.id]
    );
    ensure!(ids(db.store.alerts(&q(None, Some("p/a"), 100)).await?) == [old.id]);
    ensure!(ids(db.store.alerts(&q(None, None, 1)).await?) == [acked.id]);
    let by_model = AlertQuery {
        model: Some("nope".to_owned()),
        limit: 10,
        ..AlertQuery::default()
    };
    ensure!(db.store.alerts(&by_model).await?.is_empty());
    let active_q = AlertQuery {
        active_only: true,
        limit: 10,
        ..AlertQuery::default()
    };
    ensure!(
        ids(db.store.alerts(&active_q).await?) == [fresh.id],
        "active only"
    );
    let json = fresh.to_json();
    ensure!(
        json["id"] == fresh.id
            && json["state"] == "open"
            && json["evidence"] == fresh.evidence
            && json["resolved_by"].is_null(),
        "{json}"
    );
    Ok(())
}

/// An operator's resolution counts for `last_operator_resolution`, an auto-resolution after
/// the quiet period does not, nor does another kind, endpoint or model; an alert resolved
/// before schema v11 (no resolver recorded) counts as an operator's.
async fn alert_resolver_and_the_last_operator_resolution(db: TestDb) -> Result<()> {
    let last = || {
        db.store
            .last_operator_resolution("smollm2", "p/a", "changed")
    };
    ensure!(last().await?.is_none());
    let (first, _) = db
        .store
        .upsert_alert(&finding("p/a", "changed", 1_000, 0.3))
        .await?;
    let by_hand = db.store.resolve_alert(first.id).await?.context("resolve")?;
    ensure!(last().await? == by_hand.resolved_ms && by_hand.resolved_ms.is_some());
    // a later alert of the same kind, auto-resolved: the operator's resolution stays the last
    db.store
        .upsert_alert(&finding("p/a", "changed", 2_000, 0.3))
        .await?;
    let quiet = db.store.resolve_quiet_alerts(i64::MAX).await?;
    ensure!(quiet.len() == 1 && quiet[0].resolved_ms >= by_hand.resolved_ms);
    ensure!(last().await? == by_hand.resolved_ms, "{:?}", last().await?);
    // other kinds, endpoints and models resolved by hand do not count
    for (model, endpoint, kind) in [
        ("smollm2", "p/a", "unfaithful"),
        ("smollm2", "p/b", "changed"),
        ("other", "p/a", "changed"),
    ] {
        let (a, _) = db
            .store
            .upsert_alert(&NewAlert {
                model: model.to_owned(),
                ..finding(endpoint, kind, 3_000, 0.3)
            })
            .await?;
        db.store.resolve_alert(a.id).await?;
    }
    ensure!(last().await? == by_hand.resolved_ms);
    // an alert resolved before the resolver was recorded counts as an operator's
    let (legacy, _) = db
        .store
        .upsert_alert(&finding("p/a", "changed", 4_000, 0.3))
        .await?;
    let resolved = db
        .store
        .resolve_alert(legacy.id)
        .await?
        .context("resolve")?;
    let undo = format!(
        "UPDATE alerts SET resolved_by = NULL WHERE id = {}",
        legacy.id
    );
    behind_the_back(&db, &[&undo]).await?;
    let stored = db.store.alert(legacy.id).await?.context("legacy")?;
    ensure!(stored.resolved_by.is_none() && stored.state == AlertState::Resolved);
    ensure!(last().await? == resolved.resolved_ms);
    Ok(())
}

async fn alert_confirmation_restarts_the_quiet_period(db: TestDb) -> Result<()> {
    let s = &db.store;
    let (held, _) = s
        .upsert_alert(&finding("p/a", "eval_degraded", 1_000, 0.3))
        .await?;
    let (acked, _) = s
        .upsert_alert(&finding("p/b", "eval_degraded", 1_000, 0.3))
        .await?;
    s.ack_alert(acked.id).await?;
    let before = samewise_store::now_ms();
    for id in [held.id, acked.id] {
        let a = s.confirm_alert(id).await?.context("no alert")?;
        // seen now; nothing else changes (state, summary, evidence, updated)
        ensure!(a.last_seen_ms >= before && a.resolved_ms.is_none(), "{a:?}");
        let was = if id == held.id { &held } else { &acked };
        ensure!(a.evidence == was.evidence && a.summary == was.summary && a.opened_ms == 1_000);
    }
    ensure!(
        s.alert(acked.id)
            .await?
            .is_some_and(|a| a.state == AlertState::Acknowledged)
    );
    let swept = s.resolve_quiet_alerts(before).await?;
    ensure!(swept.is_empty(), "confirmed alerts swept: {swept:?}");
    // a resolved alert stays resolved; an unknown id is None
    s.resolve_alert(held.id).await?;
    let after = s.confirm_alert(held.id).await?.context("alert gone")?;
    ensure!(after.state == AlertState::Resolved && after.resolved_by == Some(Resolver::Operator));
    ensure!(s.active_alerts().await?.iter().all(|a| a.id != held.id));
    ensure!(s.confirm_alert(held.id + acked.id + 1).await?.is_none());
    Ok(())
}

async fn alert_concurrent_upserts(db: TestDb) -> Result<()> {
    // sixteen detectors report the same finding at once: exactly one alert is opened
    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let store = db.store.clone();
        set.spawn(async move {
            store
                .upsert_alert(&finding("p/x", "changed", 100 + i, 1.0))
                .await
        });
    }
    let mut opened = 0;
    let mut ids = std::collections::BTreeSet::new();
    while let Some(joined) = set.join_next().await {
        let (alert, new) = joined.context("upsert task panicked")??;
        opened += usize::from(new);
        ids.insert(alert.id);
    }
    ensure!(
        opened == 1 && ids.len() == 1,
        "opened {opened}, ids {ids:?}"
    );
    Ok(())
}
