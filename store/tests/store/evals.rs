//! Eval jobs: cooldown dedupe on enqueue, claim with a lease, heartbeat, take-over of an
//! expired lease with the old holder fenced out, bounded attempts, results written once per
//! (job, item, target), finish with a verdict, cancel, and concurrent claimers that never
//! share a job.

use super::*;
use anyhow::Context;
use samewise_store::{EvalResult, JobState, NewAlert, NewEvalJob};

both!(
    eval_job_lifecycle,
    eval_job_takeover_and_attempts,
    eval_concurrent_claimers,
    eval_verdict_on_alert,
    eval_verdicts_survive_concurrent_refreshes
);

fn job(endpoint: &str, suite: &str, now_ms: i64) -> NewEvalJob {
    NewEvalJob {
        model: "smollm2".to_owned(),
        endpoint: endpoint.to_owned(),
        suite: suite.to_owned(),
        baseline: "reference".to_owned(),
        alert_id: None,
        params: serde_json::json!({"budget_tokens": 1000}),
        max_attempts: 2,
        now_ms,
    }
}

fn result(item: &str, target: &str, passed: bool) -> EvalResult {
    EvalResult {
        item: item.to_owned(),
        target: target.to_owned(),
        passed,
        error_type: (!passed).then(|| "wrong_name".to_owned()),
        tokens: 10,
        record: serde_json::json!({"request": {"item": item}, "answer": "x"}),
    }
}

async fn eval_job_lifecycle(db: TestDb) -> Result<()> {
    let s = &db.store;
    let a = s
        .enqueue_eval_job(&job("p/a", "tool_calls", 1_000), 60_000)
        .await?
        .context("first job not opened")?;
    ensure!(a.state == JobState::Queued && a.attempts == 0 && a.params["budget_tokens"] == 1000);
    // within the cooldown: not opened again; another suite or endpoint is another job
    ensure!(
        s.enqueue_eval_job(&job("p/a", "tool_calls", 30_000), 60_000)
            .await?
            .is_none(),
        "cooldown did not hold"
    );
    ensure!(
        s.enqueue_eval_job(&job("p/a", "long_context", 30_000), 60_000)
            .await?
            .is_some()
    );
    ensure!(
        s.enqueue_eval_job(&job("p/b", "tool_calls", 30_000), 60_000)
            .await?
            .is_some()
    );
    // after the cooldown: opened
    let again = s
        .enqueue_eval_job(&job("p/a", "tool_calls", 61_000), 60_000)
        .await?
        .context("job after the cooldown not opened")?;
    ensure!(again.id != a.id);
    ensure!(s.eval_jobs(None, None, 100).await?.len() == 4);
    let of_b = s.eval_jobs(None, Some("p/b"), 100).await?;
    ensure!(of_b.len() == 1 && of_b[0].endpoint == "p/b", "{of_b:?}");
    ensure!(s.eval_jobs(None, Some("p/none"), 100).await?.is_empty());

    // claim: the oldest first
    let (claimed, lease) = s
        .claim_eval_job("w1", 100_000, 5_000)
        .await?
        .context("nothing claimed")?;
    ensure!(claimed.id == a.id && claimed.state == JobState::Running);
    ensure!(claimed.attempts == 1 && lease.attempt == 1 && claimed.worker.as_deref() == Some("w1"));
    ensure!(claimed.lease_until_ms == Some(105_000) && claimed.started_ms == Some(100_000));
    ensure!(
        s.heartbeat_eval_job(&lease, 101_000, 5_000, Some(3))
            .await?
    );
    let j = s.eval_job(a.id).await?.context("job gone")?;
    ensure!(j.lease_until_ms == Some(106_000) && j.items_total == Some(3));

    // results: once per item and target
    ensure!(
        s.insert_eval_result(&lease, &result("i1", "suspect", true), 101_000)
            .await?
    );
    ensure!(
        s.insert_eval_result(&lease, &result("i1", "baseline", false), 101_000)
            .await?
    );
    ensure!(
        !s.insert_eval_result(&lease, &result("i1", "suspect", false), 101_000)
            .await?,
        "a second result for one item and target was written"
    );
    let p = s.eval_progress(a.id).await?;
    ensure!(p.results == 2 && p.tokens == 20, "{p:?}");
    let rs = s.eval_results(a.id).await?;
    ensure!(rs.len() == 2 && rs[0].passed && !rs[1].passed);
    ensure!(rs[1].error_type.as_deref() == Some("wrong_name") && rs[0].record["answer"] == "x");

    // finish
    let verdict = serde_json::json!({"verdict": "degraded", "p_value": 0.001});
    ensure!(
        s.finish_eval_job(&lease, JobState::Succeeded, Some(&verdict), None, 102_000)
            .await?
    );
    let j = s.eval_job(a.id).await?.context("job gone")?;
    ensure!(j.state == JobState::Succeeded && j.finished_ms == Some(102_000));
    ensure!(j.tokens == 20 && j.verdict.as_ref() == Some(&verdict) && j.lease_until_ms.is_none());
    // a finished job takes no more results and no second finish
    ensure!(
        !s.insert_eval_result(&lease, &result("i2", "suspect", true), 103_000)
            .await?
    );
    ensure!(
        !s.finish_eval_job(&lease, JobState::Failed, None, Some("late"), 103_000)
            .await?
    );
    ensure!(
        s.finish_eval_job(&lease, JobState::Queued, None, None, 1)
            .await
            .is_err()
    );

    // cancel: queued jobs are never claimed afterwards
    let jobs = s.eval_jobs(None, None, 100).await?;
    for j in jobs.iter().filter(|j| j.state == JobState::Queued) {
        let c = s.cancel_eval_job(j.id).await?.context("cancel: no job")?;
        ensure!(c.state == JobState::Cancelled);
    }
    ensure!(s.claim_eval_job("w1", 200_000, 5_000).await?.is_none());
    ensure!(s.cancel_eval_job(999_999).await?.is_none());
    Ok(())
}

async fn eval_job_takeover_and_attempts(db: TestDb) -> Result<()> {
    let s = &db.store;
    let a = s
        .enqueue_eval_job(&job("p/a", "tool_calls", 1_000), 0)
        .await?
        .context("job not opened")?;
    let (_, l1) = s
        .claim_eval_job("w1", 1_000, 100)
        .await?
        .context("claim 1")?;
    ensure!(
        s.insert_eval_result(&l1, &result("i1", "suspect", true), 1_010)
            .await?
    );
    // the lease holds: nobody else gets the job
    ensure!(s.claim_eval_job("w2", 1_050, 100).await?.is_none());
    // w1 dies; after the lease expires w2 takes it over
    let (j2, l2) = s
        .claim_eval_job("w2", 1_200, 100)
        .await?
        .context("take-over")?;
    ensure!(j2.id == a.id && l2.attempt == 2 && j2.worker.as_deref() == Some("w2"));
    ensure!(j2.started_ms == Some(1_000), "take-over reset started_ms");
    // the old holder is fenced out
    ensure!(!s.heartbeat_eval_job(&l1, 1_210, 100, None).await?);
    ensure!(
        !s.insert_eval_result(&l1, &result("i2", "suspect", true), 1_210)
            .await?
    );
    ensure!(
        !s.finish_eval_job(&l1, JobState::Succeeded, None, None, 1_210)
            .await?
    );
    // the new holder cannot write i1 twice, but writes i2
    ensure!(
        !s.insert_eval_result(&l2, &result("i1", "suspect", false), 1_220)
            .await?
    );
    ensure!(
        s.insert_eval_result(&l2, &result("i2", "suspect", true), 1_220)
            .await?
    );
    ensure!(s.eval_results(a.id).await?.len() == 2);
    // w2 dies too: out of attempts (2), the job is failed instead of claimed
    ensure!(s.claim_eval_job("w3", 1_400, 100).await?.is_none());
    let j = s.eval_job(a.id).await?.context("job gone")?;
    ensure!(j.state == JobState::Failed && j.attempts == 2, "{j:?}");
    ensure!(j.error.as_deref().unwrap_or("").contains("attempts"));
    Ok(())
}

async fn eval_concurrent_claimers(db: TestDb) -> Result<()> {
    const JOBS: usize = 24;
    for i in 0..JOBS {
        db.store
            .enqueue_eval_job(&job(&format!("p/{i}"), "tool_calls", 1_000), 60_000)
            .await?
            .context("job not opened")?;
    }
    let mut tasks = Vec::new();
    for w in 0..6 {
        let store = db.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Some((j, _)) = store
                .claim_eval_job(&format!("w{w}"), 2_000, 60_000)
                .await?
            {
                mine.push(j.id);
            }
            anyhow::Ok(mine)
        }));
    }
    let mut all_ids = Vec::new();
    for t in tasks {
        all_ids.extend(t.await.context("claimer panicked")??);
    }
    all_ids.sort_unstable();
    let n = all_ids.len();
    all_ids.dedup();
    ensure!(n == JOBS, "{n} claims for {JOBS} jobs");
    ensure!(all_ids.len() == JOBS, "two claimers got the same job");
    Ok(())
}

async fn eval_verdict_on_alert(db: TestDb) -> Result<()> {
    let s = &db.store;
    let (alert, _) = s
        .upsert_alert(&NewAlert {
            model: "smollm2".to_owned(),
            endpoint: "p/a".to_owned(),
            kind: "unfaithful".to_owned(),
            summary: "kl".to_owned(),
            evidence: serde_json::json!({"signal": "kl_mean"}),
            now_ms: 1_000,
        })
        .await?;
    let mut nj = job("p/a", "tool_calls", 1_000);
    nj.alert_id = Some(alert.id);
    let j = s.enqueue_eval_job(&nj, 0).await?.context("not opened")?;
    ensure!(s.eval_jobs(Some(alert.id), None, 10).await?.len() == 1);
    ensure!(s.eval_jobs(Some(alert.id + 1), None, 10).await?.is_empty());
    let v = serde_json::json!({"suite": "tool_calls", "verdict": "degraded"});
    let a = s
        .attach_eval_verdict(alert.id, j.id, &v)
        .await?
        .context("alert gone")?;
    ensure!(a.evidence["signal"] == "kl_mean", "{:?}", a.evidence);
    ensure!(
        a.evidence["evals"][j.id.to_string()] == v,
        "{:?}",
        a.evidence
    );
    ensure!(
        s.attach_eval_verdict(alert.id + 1, j.id, &v)
            .await?
            .is_none()
    );
    // a detector refreshing the alert keeps the attached verdicts
    let (r, new) = s
        .upsert_alert(&NewAlert {
            model: "smollm2".to_owned(),
            endpoint: "p/a".to_owned(),
            kind: "unfaithful".to_owned(),
            summary: "kl again".to_owned(),
            evidence: serde_json::json!({"signal": "kl_p99"}),
            now_ms: 2_000,
        })
        .await?;
    ensure!(!new && r.id == alert.id && r.evidence["signal"] == "kl_p99");
    ensure!(
        r.evidence["evals"][j.id.to_string()] == v,
        "{:?}",
        r.evidence
    );
    Ok(())
}

/// A detector refreshing the alert while verdicts are attached loses none of them (the
/// refresh was a read-modify-write that could overwrite a verdict written in between; seen
/// as a flaky end-to-end test, now a compare-and-set against the stored text).
async fn eval_verdicts_survive_concurrent_refreshes(db: TestDb) -> Result<()> {
    let finding = |now_ms: i64| NewAlert {
        model: "smollm2".to_owned(),
        endpoint: "p/a".to_owned(),
        kind: "unfaithful".to_owned(),
        summary: format!("kl at {now_ms}"),
        // floats as the detectors write them: the compare-and-set must not depend on parsing
        // and re-writing giving back the same digits
        evidence: serde_json::json!({"signal": "kl_mean", "at": now_ms,
            "value": 0.23778421885733225 + now_ms as f64 * 1.3e-7, "threshold": 0.1 + 0.2}),
        now_ms,
    };
    let (alert, _) = db.store.upsert_alert(&finding(0)).await?;
    let refresher = {
        let s = db.store.clone();
        tokio::spawn(async move {
            for i in 1..=60 {
                s.upsert_alert(&finding(i)).await?;
                tokio::task::yield_now().await;
            }
            anyhow::Ok(())
        })
    };
    const VERDICTS: i64 = 12;
    for j in 0..VERDICTS {
        let v = serde_json::json!({"verdict": "degraded", "job": j});
        db.store
            .attach_eval_verdict(alert.id, j, &v)
            .await?
            .context("alert gone")?;
    }
    refresher.await??;
    db.store.upsert_alert(&finding(1_000)).await?;
    let a = db.store.alert(alert.id).await?.context("alert gone")?;
    let kept = a.evidence["evals"].as_object().map_or(0, |o| o.len());
    ensure!(
        kept == VERDICTS as usize && a.evidence["at"] == 1_000,
        "{kept} of {VERDICTS} verdicts kept: {:?}",
        a.evidence
    );
    Ok(())
}
