//! The benchmark's per-text cache (parts A and B): engine servers under a profile, the real
//! prompt_logprobs kind run once per shipped text, and seeded rounds summarized from the
//! cached positions exactly as the kind summarizes a run.

use super::*;

/// One shipped text as one endpoint answered it.
#[derive(Debug, Clone)]
pub(crate) struct TextData {
    pub(crate) tokens: i64,
    pub(crate) metrics: Vec<PositionMetrics>,
}

/// Part A's cache for one profile.
#[derive(Debug, Clone)]
pub(crate) struct ProfileData {
    pub(crate) name: String,
    pub(crate) texts: Vec<TextData>,
    /// The summary over all shipped texts in file order.
    pub(crate) all: RunSummary,
    /// Re-run rounds whose statistics matched the resampled ones bit for bit / in all.
    pub(crate) verified: (usize, usize),
    /// Per-text runs whose stored (encoded) positions reproduced the kind's kl_mean exactly.
    pub(crate) decode_exact: usize,
}

/// An engine server under `profile`, served on 127.0.0.1:0 until `stop` fires.
pub(crate) async fn start_endpoint(
    model: &Path,
    profile: &str,
    stop: &CancellationToken,
) -> Result<(Target, tokio::task::JoinHandle<()>)> {
    let p = Profile::builtin(profile).with_context(|| format!("no built-in profile {profile}"))?;
    let m = model.to_owned();
    let state = tokio::task::spawn_blocking(move || {
        ServerState::load(
            &m,
            LoadOptions {
                threads: 2,
                profile: p,
                ..LoadOptions::default()
            },
            Some("smol".into()),
        )
    })
    .await??;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = stop.clone();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, server::router(state))
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok((
        Target {
            model: "smol".into(),
            endpoint: profile.into(),
            base_url: format!("http://{addr}/v1"),
            provider_model: "smol".into(),
            api_key: None,
        },
        task,
    ))
}

pub(crate) struct Env<'a> {
    pub(crate) reference: &'a dyn Reference,
    pub(crate) cfg: &'a ModelProbes,
    pub(crate) sets: &'a PromptSets,
    pub(crate) http: &'a reqwest::Client,
}

/// The real prompt_logprobs kind on exactly `texts`, in this order, in one probe run.
pub(crate) async fn probe_texts(
    env: &Env<'_>,
    target: &Target,
    texts: Vec<LogprobText>,
) -> Result<kinds::Outcome> {
    let mut cfg = env.cfg.clone();
    cfg.items_per_round = texts.len();
    let sets = PromptSets {
        logprob_texts: texts,
        ..env.sets.clone()
    };
    let ctx = ProbeCtx {
        reference: Some(env.reference),
        cfg: &cfg,
        sets: &sets,
        http: env.http,
        round: 0,
        seed: 7,
        echo_refusals: None,
    };
    let o = kinds::run(ProbeKind::PromptLogprobs, &ctx, target).await;
    ensure!(
        o.ok,
        "{}: prompt_logprobs failed: {:?}",
        target.endpoint,
        o.error
    );
    Ok(o)
}

/// Whole texts in shuffled order while the round's probe tokens stay within `budget`
/// (at least one text).
pub(crate) fn draw_round(rng: &mut StdRng, tokens: &[i64], budget: i64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..tokens.len()).collect();
    idx.shuffle(rng);
    let mut out = Vec::new();
    let mut sum = 0;
    for i in idx {
        if !out.is_empty() && sum + tokens[i] > budget {
            break;
        }
        sum += tokens[i];
        out.push(i);
    }
    out
}

/// The round's run summary, exactly as the kind computes it (summarize over the
/// concatenated positions, in round order).
pub(crate) fn round_summary(p: &ProfileData, texts: &[usize]) -> Result<RunSummary> {
    Ok(compare::summarize(&round_metrics(p, texts))?)
}

/// The positions of `texts`, in order, as one run of the kind holds them.
pub(crate) fn round_metrics(p: &ProfileData, texts: &[usize]) -> Vec<PositionMetrics> {
    texts
        .iter()
        .flat_map(|&i| p.texts[i].metrics.iter().copied())
        .collect()
}

/// The three CUSUM statistics of a round (kl_mean, top1_same, dlogprob_mean = mean
/// |Δ logprob|) without the p99 sort; the same sums in the same order as `summarize`
/// (checked against it).
pub(crate) fn fast_stats(p: &ProfileData, texts: &[usize]) -> [f64; 3] {
    let it = || texts.iter().flat_map(|&i| p.texts[i].metrics.iter());
    let n = it().count() as f64;
    let kl = it().map(|m| m.kl).sum::<f64>() / n;
    let top1 = it().filter(|m| m.same_top1).count() as f64 / n;
    let dlp = it().map(|m| m.dlogprob.abs()).sum::<f64>() / n;
    [kl, top1, dlp]
}

pub(crate) fn stat_of(s: &RunSummary, key: &str) -> Option<f64> {
    match key {
        "kl_mean" => Some(s.kl_mean),
        "top1_same" => Some(s.top1_same),
        "dlogprob_mean" => Some(s.abs_dlogprob_mean),
        _ => None,
    }
}

/// Part A: the per-text cache of one profile, and the re-run check.
pub(crate) async fn part_a_profile(
    env: &Env<'_>,
    target: &Target,
    s: &Settings,
    log: &mut Vec<String>,
) -> Result<ProfileData> {
    let t0 = Instant::now();
    let mut texts = Vec::new();
    let mut decode_exact = 0;
    for t in &env.sets.logprob_texts {
        let o = probe_texts(env, target, vec![t.clone()]).await?;
        let raw = o.raw.as_deref().context("no raw positions")?;
        let positions = compare::decode_positions(raw)?;
        let metrics = compare::compare_run(&positions)?;
        let kl = compare::summarize(&metrics)?.kl_mean;
        if detect::stat(&o.stats, "kl_mean").map(f64::to_bits) == Some(kl.to_bits()) {
            decode_exact += 1;
        }
        let worst = metrics
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.kl.total_cmp(&b.1.kl))
            .map(|(i, m)| (i, m.kl));
        log.push(format!(
            "A {} text {}: {} tokens, {} positions, kl_mean {kl:.6}, top1_same {}, align {}, unmappable {}, worst position {worst:?}",
            target.endpoint,
            t.id,
            o.tokens,
            metrics.len(),
            o.stats["top1_same"],
            o.stats["align"],
            o.stats["unmappable"]
        ));
        texts.push(TextData {
            tokens: o.tokens,
            metrics,
        });
    }
    let all_idx: Vec<usize> = (0..texts.len()).collect();
    let mut p = ProfileData {
        name: target.endpoint.clone(),
        texts,
        all: RunSummary {
            count: 0,
            kl_mean: 0.0,
            kl_p99: 0.0,
            abs_dlogprob_mean: 0.0,
            top1_same: 0.0,
            topk_overlap: 0.0,
        },
        verified: (0, 0),
        decode_exact,
    };
    p.all = round_summary(&p, &all_idx)?;
    // the shortcut's check: whole rounds through the real kind in one probe run
    let tokens: Vec<i64> = p.texts.iter().map(|t| t.tokens).collect();
    let mut ok = 0;
    for v in 0..s.verify {
        let b = s.budgets[v % s.budgets.len()];
        let r = (v / s.budgets.len()) as u64;
        let idx = draw_round(&mut rng_for(s.seed, &[0xA, b as u64, r]), &tokens, b);
        let want = round_summary(&p, &idx)?;
        let round_texts: Vec<LogprobText> = idx
            .iter()
            .map(|&i| env.sets.logprob_texts[i].clone())
            .collect();
        let o = probe_texts(env, target, round_texts).await?;
        let mut same = o.tokens == idx.iter().map(|&i| tokens[i]).sum::<i64>();
        for key in [
            "kl_mean",
            "top1_same",
            "dlogprob_mean",
            "kl_p99",
            "topk_overlap",
        ] {
            let want_v = match key {
                "kl_p99" => want.kl_p99,
                "topk_overlap" => want.topk_overlap,
                k => stat_of(&want, k).unwrap_or(f64::NAN),
            };
            let got = detect::stat(&o.stats, key).unwrap_or(f64::NAN);
            if got.to_bits() != want_v.to_bits() {
                same = false;
                log.push(format!(
                    "{}: round B={b} #{r} {key}: real run {got:e}, resampled {want_v:e}",
                    p.name
                ));
            }
        }
        if same {
            ok += 1;
        }
    }
    p.verified = (ok, s.verify);
    let line = format!(
        "A {}: {} texts, {} tokens, {} positions, KL mean {:.5}, top1 {:.4}; per-text encode/decode exact {}/{}; verified {ok}/{} rounds bit for bit ({:.1} s)",
        p.name,
        p.texts.len(),
        tokens.iter().sum::<i64>(),
        p.all.count,
        p.all.kl_mean,
        p.all.top1_same,
        p.decode_exact,
        p.texts.len(),
        s.verify,
        t0.elapsed().as_secs_f64()
    );
    eprintln!("{line}");
    log.push(line);
    Ok(p)
}
