//! The benchmark's report: `results.json` rendered as the Markdown tables of `table.md`.

use super::*;

pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

pub(crate) fn u(v: &Value) -> usize {
    v.as_u64().unwrap_or(0) as usize
}

pub(crate) fn render_tables(r: &Value) -> Result<String> {
    use std::fmt::Write;
    let mut t = String::new();
    let set = &r["settings"];
    let budgets: Vec<i64> = set["budgets"]
        .as_array()
        .context("budgets")?
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    let rows = r["faithful"].as_array().context("faithful")?;
    for variant in ["shipped", "exact"] {
        let row = |p: &str, b: i64| {
            rows.iter().find(|x| {
                x["texts"] == variant && x["profile"] == p && x["budget"].as_i64() == Some(b)
            })
        };
        let Some(first) = rows.iter().find(|x| x["texts"] == variant) else {
            continue;
        };
        writeln!(
            t,
            "### A. faithful? (prompt_logprobs, one round; {} texts: {}; {} seeded rounds per cell; flag = {} > {:.4}, the `{}` ladder level)\n",
            first["text_count"],
            if variant == "shipped" {
                "all shipped texts".to_owned()
            } else {
                format!(
                    "without {} (not exact on the exact endpoint)",
                    r["texts"]["not_exact_on_the_exact_endpoint"]
                )
            },
            set["rounds"],
            set["metric"].as_str().unwrap_or("?"),
            f(&set["threshold"]),
            set["level"].as_str().unwrap_or("?")
        )?;
        let mut head = String::from("| profile | role | KL, all 16 texts |");
        let mut sep = String::from("|---|---|---:|");
        for b in &budgets {
            let tok = row("reference", *b).map_or(f64::NAN, |x| f(&x["mean_tokens_per_round"]));
            write!(head, " flagged, B = {b} ({tok:.0} tokens/round) |")?;
            sep.push_str("---|");
        }
        let bl = *budgets.last().context("no budgets")?;
        write!(head, " rounds / tokens to first flag, B = {bl} |")?;
        sep.push_str("---:|");
        write!(
            head,
            " diagnosed `different_model` (statistic alone), B = {} |",
            budgets
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" / ")
        )?;
        sep.push_str("---|");
        head.push_str(
            " pooled with up to 3 rounds before, each text once (as the detector pools) |",
        );
        sep.push_str("---|");
        writeln!(t, "{head}\n{sep}")?;
        for p in r["profiles"].as_array().context("profiles")? {
            let name = p["profile"].as_str().unwrap_or("?");
            let mut line = format!(
                "| {name} | {} | {:.4} |",
                role(name).split(' ').next().unwrap_or(""),
                f(&p["kl_mean_all_texts"])
            );
            for b in &budgets {
                let x = row(name, *b).context("row")?;
                write!(line, " {} |", pct(u(&x["flags"]), u(&x["rounds"])))?;
            }
            let x = row(name, bl).context("row")?;
            if u(&x["detection_episodes"]) == 0 {
                line.push_str(" never |");
            } else {
                write!(
                    line,
                    " {:.2} / {:.0} |",
                    f(&x["mean_rounds_to_flag"]),
                    f(&x["mean_tokens_to_flag"])
                )?;
            }
            let rates = |named: &str, rounds: &str| -> String {
                budgets
                    .iter()
                    .map(|b| {
                        row(name, *b).map_or("?".into(), |x| {
                            let n = u(&x[named]) as f64;
                            format!("{:.1}%", 100.0 * n / u(&x[rounds]).max(1) as f64)
                        })
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            write!(
                line,
                " {} | {} |",
                rates("named_different_model", "rounds"),
                rates("named_different_model_pooled4", "pooled4_rounds")
            )?;
            writeln!(t, "{line}")?;
        }
        writeln!(t)?;
    }
    // parts A and B (none with ONLY_C)
    if set["only_c"] != true {
        let ver: Vec<String> = r["profiles"]
            .as_array()
            .context("profiles")?
            .iter()
            .map(|p| {
                format!(
                    "{} {}/{}",
                    p["profile"].as_str().unwrap_or("?"),
                    p["verified_rounds"],
                    p["verify_rounds"]
                )
            })
            .collect();
        writeln!(
            t,
            "\nRe-run rounds identical bit for bit to the resampled ones: {}.",
            ver.join(", ")
        )?;

        writeln!(
            t,
            "\n### B. changed? (CUSUM: k {}, h {:.3}{}, two-sided, ARL0 {:.0} per chart, baseline {} rounds; charts {})\n",
            set["cusum"]["k"],
            f(&set["cusum_chart_h"]),
            if set["cusum_baseline_correction"] == true {
                format!(
                    " (raised for the estimated baseline from {:.3})",
                    f(&set["cusum"]["h"])
                )
            } else {
                String::new()
            },
            f(&set["cusum_arl0"]),
            set["cusum"]["baseline_rounds"],
            set["cusum_statistics"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        )?;
        writeln!(
            t,
            "| rounds | P0 → P1 at round {} | worlds | tokens/round | false alarms before the switch | detected | rounds to alarm, median / p95 | tokens to alarm, median / p95 | within 3 rounds |",
            set["switch_at"]
        )?;
        writeln!(t, "|---|---|---:|---:|---|---:|---|---|---:|")?;
        for x in r["changed"].as_array().context("changed")? {
            let rounds = if x["rounds"] == "random" {
                format!("random, B = {}", set["switch_budget"])
            } else {
                format!(
                    "scheduler window ({} texts)",
                    set["items_per_round_default"]
                )
            };
            writeln!(
                t,
                "| {rounds} | {} → {} | {} | {:.0} | {} / {} | {} | {} / {} | {} / {} | {:.1}% |",
                x["p0"].as_str().unwrap_or("?"),
                x["p1"].as_str().unwrap_or("?"),
                x["worlds"],
                f(&x["mean_tokens_per_round"]),
                x["pre_switch_alarms"],
                x["pre_switch_monitored_rounds"],
                x["detected"],
                x["delay_rounds_median"],
                x["delay_rounds_p95"],
                x["delay_tokens_median"],
                x["delay_tokens_p95"],
                100.0 * f(&x["detected_within_3_share"])
            )?;
        }
        for x in r["in_control"].as_array().context("in_control")? {
            let per: Vec<String> = x["alarms_per_chart"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|c| {
                            format!("{} {}", c["statistic"].as_str().unwrap_or("?"), c["alarms"])
                        })
                        .collect()
                })
                .unwrap_or_default();
            writeln!(
                t,
                "\nIn control (a8, {} rounds, {} × {} rounds, charts rebuilt from the fixed baseline over the newest {} runs as the detector does): any-chart alarm rate {} of {} monitored rounds ({}); per chart {}; documented ARL0 {:.0} rounds per chart (rate {:.4}); median rounds to the first alarm {}, {} of {} worlds without an alarm.",
                x["rounds"].as_str().unwrap_or("?"),
                x["worlds"],
                x["rounds_per_world"],
                x["history_runs"],
                pct(u(&x["alarm_rounds_any_chart"]), u(&x["monitored_rounds"])),
                x["monitored_rounds"],
                x["alarm_rounds_any_chart"],
                per.join(", "),
                f(&x["documented_arl0_per_chart"]),
                1.0 / f(&x["documented_arl0_per_chart"]),
                x["first_alarm_monitored_round_median"],
                x["worlds_without_alarm"],
                x["worlds"]
            )?;
        }
    }

    if let Some(rows) = r["samples"].as_array().filter(|a| !a.is_empty()) {
        let alpha = &rows[0]["samples_alpha"];
        writeln!(
            t,
            "\n### C. samples (pools of {} samples per prompt; a round of P × N: the rotating window of P prompts, N samples per side and prompt; {} rounds per row; flagged = p < {alpha})\n",
            rows[0]["pool"], set["sample_rounds"]
        )?;
        writeln!(
            t,
            "| endpoint vs reference sampler | round | permutations | MMD alone | log-likelihood alone | both, Bonferroni (the detector) | both at p < 0.05 | median p (MMD / loglik / both) | tokens/round |"
        )?;
        writeln!(t, "|---|---|---:|---|---|---|---|---|---:|")?;
        for x in rows {
            let n = u(&x["rounds"]);
            writeln!(
                t,
                "| {} ({}) | {} × {} | {} | {} | {} | **{}** | {} | {:.3} / {:.3} / {:.3} | {:.0} |",
                x["endpoint"].as_str().unwrap_or("?"),
                x["role"]
                    .as_str()
                    .unwrap_or("?")
                    .split(' ')
                    .next()
                    .unwrap_or(""),
                x["prompts"],
                x["samples_per_prompt"],
                x["permutations"],
                pct(u(&x["flags_mmd"]), n),
                pct(u(&x["flags_loglik"]), n),
                pct(u(&x["flags"]), n),
                pct(u(&x["flags_0.05"]), n),
                f(&x["median_p_mmd"]),
                f(&x["median_p_loglik"]),
                f(&x["median_p"]),
                f(&x["mean_tokens_per_round"])
            )?;
        }
    }
    for x in r["samples_real"].as_array().into_iter().flatten() {
        writeln!(
            t,
            "\nReal samples kind, product defaults ({} prompts × {} samples per round), fresh samples, {}: flagged (Bonferroni p < {}) in {} of {} rounds, {:.0} tokens per round, {:.0} s.",
            x["prompts"],
            x["samples_per_prompt"],
            x["endpoint"].as_str().unwrap_or("?"),
            x["samples_alpha"],
            pct(u(&x["flags"]), u(&x["rounds"])),
            x["rounds"],
            f(&x["mean_tokens_per_round"]),
            f(&x["seconds"])
        )?;
    }
    writeln!(
        t,
        "\nCollection (engine runs) {:.0} s, total {:.0} s.",
        f(&r["collect_seconds"]),
        f(&r["total_seconds"])
    )?;
    if r["log"].as_array().is_some_and(|l| {
        l.iter()
            .any(|x| x.as_str().is_some_and(|s| s.contains(", resampled ")))
    }) {
        writeln!(
            t,
            "\nWARNING: some re-run rounds differ from the resampled ones (see the log in results.json)."
        )?;
    }
    Ok(t)
}
