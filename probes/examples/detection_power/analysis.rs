//! The benchmark's analyses over the collected data: A (faithful? per profile and round
//! budget), B (changed? after a switch, and the in-control run) and C (the samples rounds).
//! Each returns the rows `results.json` lists.

use super::*;

/// What every analysis reads.
pub(crate) struct Bench<'a> {
    pub(crate) s: &'a Settings,
    pub(crate) cfg: &'a ModelProbes,
    pub(crate) det: &'a DetectorConfig,
    /// Probe tokens of each shipped text (the same under every profile).
    pub(crate) tokens: &'a [i64],
}

/// The per-text token counts, checked equal across profiles.
pub(crate) fn text_tokens(profiles: &[ProfileData]) -> Result<Vec<i64>> {
    let tokens: Vec<i64> = profiles
        .first()
        .context("no profiles")?
        .texts
        .iter()
        .map(|t| t.tokens)
        .collect();
    for p in profiles {
        let t: Vec<i64> = p.texts.iter().map(|t| t.tokens).collect();
        ensure!(
            t == tokens,
            "{}: text token counts differ from {}",
            p.name,
            profiles[0].name
        );
    }
    Ok(tokens)
}

/// The text subsets part A draws from: the shipped texts, and those on which the exact
/// (reference-profile) endpoint compares exactly (KL 0, same top-1 everywhere) when some do
/// not (texts it does not are a probe artefact); and the ids of those that do not.
pub(crate) fn text_variants(
    profiles: &[ProfileData],
    sets: &PromptSets,
    n: usize,
) -> (Vec<(&'static str, Vec<usize>)>, Vec<String>) {
    let all_texts: Vec<usize> = (0..n).collect();
    let exact_texts: Vec<usize> = match profiles.iter().find(|p| p.name == "reference") {
        Some(rp) => (0..n)
            .filter(|&i| {
                round_summary(rp, &[i]).is_ok_and(|x| x.kl_mean == 0.0 && x.top1_same == 1.0)
            })
            .collect(),
        None => Vec::new(),
    };
    let inexact_ids: Vec<String> = all_texts
        .iter()
        .filter(|i| !exact_texts.contains(i))
        .map(|&i| sets.logprob_texts[i].id.clone())
        .collect();
    let mut variants = vec![("shipped", all_texts.clone())];
    if !exact_texts.is_empty() && exact_texts.len() < all_texts.len() {
        variants.push(("exact", exact_texts));
    }
    (variants, inexact_ids)
}

/// A: faithful? for every text subset, profile and budget, over seeded rounds.
pub(crate) fn faithful_rows(
    b: &Bench<'_>,
    profiles: &[ProfileData],
    variants: &[(&str, Vec<usize>)],
    ladder: &Ladder,
) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for (variant, subset) in variants {
        for p in profiles {
            for &budget in &b.s.budgets {
                rows.push(faithful_row(b, p, variant, subset, budget, ladder)?);
            }
        }
    }
    Ok(rows)
}

/// A for one text subset, profile and budget.
fn faithful_row(
    b: &Bench<'_>,
    p: &ProfileData,
    variant: &str,
    subset: &[usize],
    budget: i64,
    ladder: &Ladder,
) -> Result<Value> {
    let (s, det, tokens) = (b.s, b.det, b.tokens);
    let sub_tokens: Vec<i64> = subset.iter().map(|&i| tokens[i]).collect();
    let (mut flags, mut tok_sum, mut texts_sum) = (0usize, 0i64, 0usize);
    let (mut since_r, mut since_t) = (0usize, 0i64);
    let (mut ep_r, mut ep_t) = (Vec::new(), Vec::new());
    let mut kl = Vec::with_capacity(s.rounds);
    // rounds whose positions the prompt probe would diagnose as another model's, alone and
    // pooled with the POOLED - 1 rounds before (as the faithful detector pools the runs since
    // an endpoint went over the threshold)
    const POOLED: usize = 4;
    let mut named_other = 0usize;
    let (mut named_pooled, mut pooled_rounds, mut pooled_texts) = (0usize, 0usize, 0usize);
    let mut recent: std::collections::VecDeque<Vec<usize>> = std::collections::VecDeque::new();
    for r in 0..s.rounds {
        let idx: Vec<usize> = draw_round(
            &mut rng_for(s.seed, &[0xA, budget as u64, r as u64]),
            &sub_tokens,
            budget,
        )
        .into_iter()
        .map(|i| subset[i])
        .collect();
        let rt: i64 = idx.iter().map(|&i| tokens[i]).sum();
        let sum = round_summary(p, &idx)?;
        if samewise_probes::kinds::different_model_of(&round_metrics(p, &idx)).is_some() {
            named_other += 1;
        }
        recent.push_front(idx.clone());
        recent.truncate(POOLED);
        if recent.len() == POOLED {
            // as the detector pools: this round and those before it, back to one that scored
            // a text already pooled (each text counted once)
            let mut texts: Vec<usize> = Vec::new();
            for round in &recent {
                if round.iter().any(|i| texts.contains(i)) {
                    break;
                }
                texts.extend(round);
            }
            pooled_rounds += 1;
            pooled_texts += texts.len();
            if samewise_probes::kinds::different_model_of(&round_metrics(p, &texts)).is_some() {
                named_pooled += 1;
            }
        }
        let j = noise::judge(ladder, det.metric, sum.kl_mean, None, &det.rule)?;
        tok_sum += rt;
        texts_sum += idx.len();
        since_r += 1;
        since_t += rt;
        kl.push(sum.kl_mean);
        if j.unfaithful {
            flags += 1;
            ep_r.push(since_r as f64);
            ep_t.push(since_t as f64);
            since_r = 0;
            since_t = 0;
        }
    }
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    Ok(json!({
        "texts": variant, "text_count": subset.len(),
        "profile": p.name, "role": role(&p.name), "budget": budget, "rounds": s.rounds,
        "flags": flags, "flag_rate": flags as f64 / s.rounds as f64,
        "named_different_model": named_other,
        "named_different_model_pooled4": named_pooled, "pooled4_rounds": pooled_rounds,
        "pooled4_mean_texts": pooled_texts as f64 / pooled_rounds.max(1) as f64,
        "wilson95": wilson(flags, s.rounds),
        "mean_tokens_per_round": tok_sum as f64 / s.rounds as f64,
        "mean_texts_per_round": texts_sum as f64 / s.rounds as f64,
        "kl_mean_of_rounds": {"mean": mean(&kl), "min": kl.iter().copied().fold(f64::INFINITY, f64::min),
                              "max": kl.iter().copied().fold(f64::NEG_INFINITY, f64::max)},
        "detection_episodes": ep_r.len(),
        "mean_rounds_to_flag": mean(&ep_r),
        "mean_tokens_to_flag": mean(&ep_t),
    }))
}

/// B's watched statistics (the detector's CUSUM statistics among the three the fast sums
/// give) and each one's position in `fast_stats`.
pub(crate) fn cusum_keys(det: &DetectorConfig) -> Result<(Vec<String>, Vec<usize>)> {
    let keys: Vec<String> = det
        .cusum_statistics
        .iter()
        .filter(|k| ["kl_mean", "top1_same", "dlogprob_mean"].contains(&k.as_str()))
        .cloned()
        .collect();
    ensure!(keys.len() == 3, "unexpected CUSUM statistics {keys:?}");
    let key_pos: Vec<usize> = keys
        .iter()
        .map(|k| match k.as_str() {
            "kl_mean" => 0,
            "top1_same" => 1,
            _ => 2,
        })
        .collect();
    Ok((keys, key_pos))
}

fn stats_of(p: &ProfileData, idx: &[usize], key_pos: &[usize]) -> [f64; 3] {
    let f = fast_stats(p, idx);
    [f[key_pos[0]], f[key_pos[1]], f[key_pos[2]]]
}

/// The fast sums are the summarize sums: checked on some rounds of every profile; the number
/// of rounds checked.
pub(crate) fn check_fast_stats(b: &Bench<'_>, profiles: &[ProfileData]) -> Result<usize> {
    let mut fast_checked = 0;
    for p in profiles {
        for r in 0..50u64 {
            let idx = draw_round(
                &mut rng_for(b.s.seed, &[0xB0, r]),
                b.tokens,
                b.s.switch_budget,
            );
            let f = fast_stats(p, &idx);
            let sm = round_summary(p, &idx)?;
            ensure!(
                f[0].to_bits() == sm.kl_mean.to_bits()
                    && f[1].to_bits() == sm.top1_same.to_bits()
                    && f[2].to_bits() == sm.abs_dlogprob_mean.to_bits(),
                "fast stats differ from summarize for {}",
                p.name
            );
            fast_checked += 1;
        }
    }
    Ok(fast_checked)
}

/// The scheduler's rotating window over the texts: `items_per_round` starting at round · count.
fn window_round(b: &Bench<'_>, r: usize, offset: usize) -> Vec<usize> {
    window_of(r + offset, b.cfg.items_per_round, b.tokens.len())
}

/// Distinct start offsets of the rotating window.
fn window_worlds(b: &Bench<'_>) -> usize {
    b.tokens
        .len()
        .div_ceil(b.cfg.items_per_round.clamp(1, b.tokens.len()))
}

/// The texts of round `r` of world `w`: a seeded draw within the budget, or the window.
fn round_texts(b: &Bench<'_>, mode: &str, rng: &mut StdRng, r: usize, w: usize) -> Vec<usize> {
    if mode == "random" {
        draw_round(rng, b.tokens, b.s.switch_budget)
    } else {
        window_round(b, r, w)
    }
}

/// B: changed? after a switch from P0 to P1, per round mode and profile pair.
pub(crate) fn changed_rows(
    b: &Bench<'_>,
    profiles: &[ProfileData],
    key_pos: &[usize],
) -> Result<Vec<Value>> {
    let by_name = |n: &str| profiles.iter().find(|p| p.name == n);
    let mut rows = Vec::new();
    for (mode, worlds) in [("random", b.s.worlds), ("window", window_worlds(b))] {
        for p0n in ["reference", "a8"] {
            for p1n in ["w6", "w5", "w4"] {
                let (Some(p0), Some(p1)) = (by_name(p0n), by_name(p1n)) else {
                    continue;
                };
                rows.push(switch_row(b, mode, worlds, (p0, p1), key_pos)?);
            }
        }
    }
    Ok(rows)
}

/// B for one round mode and profile pair, over `worlds` seeded worlds.
fn switch_row(
    b: &Bench<'_>,
    mode: &str,
    worlds: usize,
    (p0, p1): (&ProfileData, &ProfileData),
    key_pos: &[usize],
) -> Result<Value> {
    let (s, det) = (b.s, b.det);
    let mut pre_alarms = 0usize;
    let mut pre_rounds = 0usize;
    let (mut delays, mut delay_tokens) = (Vec::new(), Vec::new());
    let mut undetected = 0;
    let mut round_tokens = 0i64;
    let mut round_count = 0usize;
    for w in 0..worlds {
        let mut rng = rng_for(s.seed, &[0xB, w as u64]);
        let (mut series, mut round_tok) = (Vec::new(), Vec::new());
        for r in 0..s.switch_at + s.max_after {
            let idx = round_texts(b, mode, &mut rng, r, w);
            round_tok.push(idx.iter().map(|&i| b.tokens[i]).sum::<i64>());
            let p = if r < s.switch_at { p0 } else { p1 };
            series.push(stats_of(p, &idx, key_pos));
        }
        let alarms = alarms_with_window(det, &series, det.history_runs as usize)?;
        let mut after_tokens = 0i64;
        let mut found = false;
        for (r, a) in alarms.iter().enumerate() {
            let rt = round_tok[r];
            round_tokens += rt;
            round_count += 1;
            let alarm = a.iter().any(|&x| x);
            if r < s.switch_at {
                if r >= det.cusum.baseline_rounds {
                    pre_rounds += 1;
                    pre_alarms += usize::from(alarm);
                }
                continue;
            }
            after_tokens += rt;
            if alarm {
                delays.push((r - s.switch_at + 1) as f64);
                delay_tokens.push(after_tokens as f64);
                found = true;
                break;
            }
        }
        if !found {
            undetected += 1;
        }
    }
    let within3 = delays.iter().filter(|&&d| d <= 3.0).count();
    Ok(json!({
        "rounds": mode, "p0": p0.name, "p1": p1.name, "worlds": worlds,
        "mean_tokens_per_round": round_tokens as f64 / round_count.max(1) as f64,
        "pre_switch_monitored_rounds": pre_rounds, "pre_switch_alarms": pre_alarms,
        "pre_switch_alarm_rate": pre_alarms as f64 / pre_rounds.max(1) as f64,
        "detected": delays.len(), "undetected_within": [undetected, s.max_after],
        "delay_rounds_median": quantile(&delays, 0.5), "delay_rounds_p95": quantile(&delays, 0.95),
        "delay_tokens_median": quantile(&delay_tokens, 0.5), "delay_tokens_p95": quantile(&delay_tokens, 0.95),
        "detected_within_3_rounds": within3, "detected_within_3_share": within3 as f64 / worlds as f64,
    }))
}

/// B in control: a8 for `ic_rounds` rounds per world, charts as the detector rebuilds them.
pub(crate) fn in_control_rows(
    b: &Bench<'_>,
    profiles: &[ProfileData],
    keys: &[String],
    key_pos: &[usize],
) -> Result<Vec<Value>> {
    let (s, det) = (b.s, b.det);
    let mut rows = Vec::new();
    let Some(a8) = profiles.iter().find(|p| p.name == "a8") else {
        return Ok(rows);
    };
    for (mode, worlds) in [("random", s.worlds), ("window", window_worlds(b))] {
        let mut any = 0usize;
        let mut per_chart = [0usize; 3];
        let mut monitored = 0usize;
        let mut first_alarm = Vec::new();
        let mut no_alarm = 0usize;
        for w in 0..worlds {
            let mut rng = rng_for(s.seed, &[0x1C, w as u64]);
            let series: Vec<[f64; 3]> = (0..s.ic_rounds)
                .map(|r| stats_of(a8, &round_texts(b, mode, &mut rng, r, w), key_pos))
                .collect();
            let alarms = alarms_with_window(det, &series, det.history_runs as usize)?;
            let mut first = None;
            for (t, a) in alarms.iter().enumerate() {
                if t < det.cusum.baseline_rounds {
                    continue;
                }
                monitored += 1;
                for (c, &x) in a.iter().enumerate() {
                    per_chart[c] += usize::from(x);
                }
                if a.iter().any(|&x| x) {
                    any += 1;
                    first.get_or_insert(t + 1 - det.cusum.baseline_rounds);
                }
            }
            match first {
                Some(f) => first_alarm.push(f as f64),
                None => no_alarm += 1,
            }
        }
        rows.push(json!({
            "rounds": mode, "p0": "a8", "worlds": worlds, "rounds_per_world": s.ic_rounds,
            "history_runs": det.history_runs, "monitored_rounds": monitored,
            "alarm_rounds_any_chart": any, "alarm_rate_any_chart": any as f64 / monitored.max(1) as f64,
            "wilson95": wilson(any, monitored),
            "alarms_per_chart": keys.iter().zip(per_chart).map(|(k, n)| json!({"statistic": k, "alarms": n})).collect::<Vec<_>>(),
            "documented_arl0_per_chart": det.cusum.arl0(),
            "first_alarm_monitored_round_median": quantile(&first_alarm, 0.5),
            "worlds_without_alarm": no_alarm,
        }));
    }
    Ok(rows)
}

/// Part C's rows: per endpoint pool and round shape (the scheduler's rotating window of P
/// prompts, N samples per side and prompt), `SAMPLE_ROUNDS` seeded rounds with the kind's
/// permutations; with `HI_PERMUTATIONS`, the last shape again with that many.
pub(crate) fn samples_rows(
    b: &Bench<'_>,
    pools: &[Pool],
    rf: &Pool,
    n_prompts: usize,
) -> Result<Vec<Value>> {
    let (s, cfg) = (b.s, b.cfg);
    let mut rows = Vec::new();
    for (ti, ep) in pools.iter().enumerate() {
        let mut runs: Vec<((usize, usize), usize, Vec<RoundP>)> = Vec::new();
        for (si, &(np, per)) in s.shapes.iter().enumerate() {
            let ps = samples_rounds(
                ep,
                rf,
                s,
                (s.sample_rounds, per, cfg.permutations),
                |r| window_of(r, np, n_prompts),
                (ti * 100 + si) as u64,
            )?;
            runs.push(((np, per), cfg.permutations, ps));
        }
        if let (true, Some(&(np, per))) = (s.hi_permutations > 0, s.shapes.last()) {
            let ps = samples_rounds(
                ep,
                rf,
                s,
                (s.hi_rounds, per, s.hi_permutations),
                |r| window_of(r, np, n_prompts),
                (ti * 100 + 99) as u64,
            )?;
            runs.push(((np, per), s.hi_permutations, ps));
        }
        for ((np, per), perms, ps) in runs {
            // probe tokens of a round: per prompt one request (its prompt once) and N samples
            let tokens = (0..n_prompts)
                .map(|r| {
                    window_of(r, np, n_prompts)
                        .iter()
                        .map(|&i| ep.prompt_tokens[i] + per as f64 * ep.completion_per_sample[i])
                        .sum::<f64>()
                })
                .sum::<f64>()
                / n_prompts as f64;
            rows.push(samples_row(b, ep, (np, per, perms), &ps, tokens));
        }
    }
    Ok(rows)
}

/// The scheduler's rotating window (`kinds::window`) over item indices `0..n`.
fn window_of(round: usize, count: usize, n: usize) -> Vec<usize> {
    kinds::window(&(0..n).collect::<Vec<_>>(), round as u64, count)
}

/// One C row: the flag rates of one run's rounds, per test and as the detector decides.
fn samples_row(
    b: &Bench<'_>,
    ep: &Pool,
    (np, per, perms): (usize, usize, usize),
    ps: &[RoundP],
    t: f64,
) -> Value {
    let alpha = b.det.samples_alpha;
    let n = ps.len();
    let count = |f: &dyn Fn(&RoundP) -> bool| ps.iter().filter(|p| f(p)).count();
    let mmd = count(&|p| p.mmd < alpha);
    let loglik = count(&|p| p.loglik.is_some_and(|l| l < alpha));
    let both = count(&|p| p.combined() < alpha);
    let both05 = count(&|p| p.combined() < 0.05);
    let median = |f: &dyn Fn(&RoundP) -> f64| quantile(&ps.iter().map(f).collect::<Vec<_>>(), 0.5);
    json!({
        "endpoint": ep.name, "role": if ep.name == "reference" { "null (flag = false alarm)" } else { "power" },
        "prompts": np, "samples_per_prompt": per, "pool": ep.samples.first().map_or(0, Vec::len),
        "permutations": perms, "rounds": n, "samples_alpha": alpha,
        "flags_mmd": mmd, "flags_loglik": loglik, "flags": both, "flags_0.05": both05,
        "flag_rate": both as f64 / n as f64, "wilson95": wilson(both, n),
        "median_p_mmd": median(&|p| p.mmd), "median_p_loglik": median(&|p| p.loglik.unwrap_or(f64::NAN)),
        "median_p": median(&|p| p.combined()), "mean_tokens_per_round": t,
    })
}
