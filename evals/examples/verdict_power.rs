//! The eval verdict-power benchmark's resampler (not a test; `bench/evals/run.sh` drives it).
//!
//! Every item of a pool was answered once by the reference, by `a8` and by `tool-corrupt`
//! (every call corrupted), through the real worker (`samewise evals run`, one look, so no
//! early stop) and exported per item. The engine is deterministic, so a job of any size is a
//! draw of items from that cache:
//!
//! - `a8` and the reference's own endpoint answer as cached;
//! - `tool-corrupt` at fraction f answers as the reference (the same engine and weights: the
//!   profile only rewrites calls after generation) unless one of the item's m calls is drawn
//!   for corruption, with probability 1 − (1 − f)^m, and then as the every-call-corrupted
//!   answer (any corrupted call fails the item under BFCL's rules).
//!
//! `power` draws JOBS jobs per scenario and size (items without replacement, in a random
//! order), runs the worker's own sequential rule on them (`plan_looks`, `decide`,
//! `stop_reason`: the same functions the worker calls) and writes `power.json` and
//! `power.md`; it also writes VERIFY jobs per scenario as suite files in their drawn order
//! with the simulated outcome. `check` takes one such job re-run through the real worker and
//! compares it with the cache bit for bit: every baseline answer and every uncorrupted
//! suspect answer byte-identical to the cached one, every corrupted item failed as the cache
//! says, and the verdict, looks, items and paired table equal to the resampler's.
//!
//! ```text
//! verdict_power power --a8 A8.jsonl --corrupt CORRUPT.jsonl --suite SUITE.jsonl --out DIR
//!     [--runs a8.json,corrupt.json] [--sizes 50,100,200,400] [--fractions 0.1,0.05]
//!     [--jobs 2000] [--verify 2] [--verify-size 200] [--verify-fraction 0.1] [--seed 1]
//!     [--delta 0.05] [--alpha 0.01] [--looks 4] [--budget 200000]
//! verdict_power check --plan PLAN.json --job JOB.json --export EXPORT.jsonl
//!     --a8 A8.jsonl --corrupt CORRUPT.jsonl
//! ```

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samewise_evals::{
    Paired, Verdict, VerdictParams, decide_all, plan_looks, schema_valid, stop_reason,
};
use serde_json::{Value, json};

/// One side's cached answer to one item.
#[derive(Debug, Clone)]
struct Answer {
    passed: bool,
    tokens: i64,
    /// What a re-run must repeat byte for byte: the answer's content, its calls (name and
    /// arguments; call ids are per response) and its finish reason.
    message: Value,
    /// Tool calls in the answer.
    calls: usize,
    /// Its calls' schema validity (None: no tools offered).
    valid: Option<bool>,
}

/// The cache: per item, the reference's, `a8`'s and the every-call-corrupted answer.
#[derive(Debug, Default)]
struct Cache {
    ids: Vec<String>,
    reference: HashMap<String, Answer>,
    a8: HashMap<String, Answer>,
    corrupt: HashMap<String, Answer>,
    /// Items whose two cached reference answers (one per job) differ.
    reference_mismatches: usize,
}

/// A job export: (item, target) → answer.
fn read_export(path: &Path) -> Result<Vec<(String, String, Answer)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_owned)
                .with_context(|| format!("{}:{}: no {k}", path.display(), i + 1))
        };
        let answer = Answer {
            passed: v["passed"].as_bool().unwrap_or(false),
            tokens: v["tokens"].as_i64().unwrap_or(0),
            message: json!([
                v["record"]["answer"]["content"],
                v["record"]["calls"],
                v["record"]["finish_reason"],
            ]),
            calls: v["record"]["calls"].as_array().map_or(0, Vec::len),
            valid: schema_valid(&v["record"]),
        };
        out.push((field("item")?, field("target")?, answer));
    }
    Ok(out)
}

impl Cache {
    fn load(a8: &Path, corrupt: &Path) -> Result<Cache> {
        let mut c = Cache::default();
        let mut second_reference = HashMap::new();
        for (item, target, a) in read_export(a8)? {
            match target.as_str() {
                "suspect" => drop(c.a8.insert(item, a)),
                _ => {
                    c.ids.push(item.clone());
                    c.reference.insert(item, a);
                }
            }
        }
        for (item, target, a) in read_export(corrupt)? {
            match target.as_str() {
                "suspect" => drop(c.corrupt.insert(item, a)),
                _ => drop(second_reference.insert(item, a)),
            }
        }
        c.ids
            .retain(|id| c.a8.contains_key(id) && c.corrupt.contains_key(id));
        c.ids.sort();
        c.reference_mismatches = c
            .ids
            .iter()
            .filter(|id| {
                second_reference.get(*id).map(|a: &Answer| &a.message)
                    != c.reference.get(*id).map(|a| &a.message)
            })
            .count();
        ensure!(!c.ids.is_empty(), "no item answered by all three sides");
        Ok(c)
    }

    /// The suspect's outcome for `id` in `scenario`, drawing the corruption from `rng`.
    fn suspect(&self, scenario: &Scenario, id: &str, rng: &mut StdRng) -> Option<&Answer> {
        let reference = self.reference.get(id)?;
        match scenario {
            Scenario::Reference => Some(reference),
            Scenario::A8 => self.a8.get(id),
            Scenario::Corrupt(f) => {
                let p = 1.0 - (1.0 - f).powi(i32::try_from(reference.calls).unwrap_or(i32::MAX));
                if rng.random::<f64>() < p {
                    self.corrupt.get(id)
                } else {
                    Some(reference)
                }
            }
        }
    }
}

/// Who the suspect is.
#[derive(Debug, Clone, PartialEq)]
enum Scenario {
    Reference,
    A8,
    Corrupt(f64),
}

impl Scenario {
    fn name(&self) -> String {
        match self {
            Scenario::Reference => "reference".into(),
            Scenario::A8 => "a8".into(),
            Scenario::Corrupt(f) => format!("tool-corrupt {f}"),
        }
    }

    fn slug(&self) -> String {
        match self {
            Scenario::Corrupt(f) => format!("corrupt-{f}"),
            other => other.name(),
        }
    }
}

/// One item of a job: both sides' check and schema validity, and the tokens of both.
#[derive(Debug, Clone, Copy)]
struct Row {
    suspect: bool,
    baseline: bool,
    suspect_valid: Option<bool>,
    baseline_valid: Option<bool>,
    tokens: i64,
}

impl Row {
    fn of(s: &Answer, b: &Answer) -> Row {
        Row {
            suspect: s.passed,
            baseline: b.passed,
            suspect_valid: s.valid,
            baseline_valid: b.valid,
            tokens: s.tokens + b.tokens,
        }
    }
}

/// One job's rows in the worker's item order.
type Outcomes = Vec<Row>;

/// What the worker's sequential rule makes of a job.
#[derive(Debug, Clone, PartialEq)]
struct Simulated {
    verdict: Verdict,
    looks_done: u32,
    items: usize,
    paired: Paired,
    schema: Paired,
    tokens: i64,
    stopped: &'static str,
}

/// The worker's loop (`work_items`) over outcomes known in advance.
fn simulate(outcomes: &Outcomes, params: &VerdictParams, budget: i64) -> Simulated {
    let mut looks_done = 0u32;
    let mut stopped = "all_items";
    let mut used = 0usize;
    let mut params = *params;
    let params = &mut params;
    for point in plan_looks(outcomes.len(), params) {
        used = point;
        looks_done += 1;
        let (t, spent) = tables(&outcomes[..point]);
        if let Some(r) = stop_reason(decide_all(&t, params, looks_done).0, spent, budget) {
            stopped = r;
            break;
        }
    }
    let ([paired, schema], tokens) = tables(&outcomes[..used]);
    Simulated {
        verdict: decide_all(&[paired, schema], params, looks_done.max(1)).0,
        looks_done,
        items: used,
        paired,
        schema,
        tokens,
        stopped,
    }
}

/// The worker's two tables (checks, schema validity) and the tokens spent.
fn tables(rows: &[Row]) -> ([Paired; 2], i64) {
    let (mut t, mut schema) = (Paired::default(), Paired::default());
    let mut spent = 0;
    for r in rows {
        t.add(r.suspect, r.baseline);
        if let (Some(s), Some(b)) = (r.suspect_valid, r.baseline_valid) {
            schema.add(s, b);
        }
        spent += r.tokens;
    }
    ([t, schema], spent)
}

/// `--key value` arguments.
struct Args(HashMap<String, String>);

impl Args {
    fn parse(args: &[String]) -> Result<Args> {
        let mut m = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let key = k
                .strip_prefix("--")
                .with_context(|| format!("expected --key, got {k:?}"))?;
            let v = it
                .next()
                .with_context(|| format!("--{key} needs a value"))?;
            m.insert(key.to_owned(), v.clone());
        }
        Ok(Args(m))
    }

    fn path(&self, k: &str) -> Result<PathBuf> {
        self.0
            .get(k)
            .map(PathBuf::from)
            .with_context(|| format!("--{k} is required"))
    }

    fn get<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T> {
        match self.0.get(k) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .ok()
                .with_context(|| format!("--{k}: bad value {v:?}")),
        }
    }

    fn list<T: std::str::FromStr>(&self, k: &str, default: &str) -> Result<Vec<T>> {
        let s = self.0.get(k).map_or(default, String::as_str);
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| {
                x.parse()
                    .ok()
                    .with_context(|| format!("--{k}: bad value {x:?}"))
            })
            .collect()
    }

    fn params(&self) -> Result<(VerdictParams, i64)> {
        let d = VerdictParams::default();
        Ok((
            VerdictParams {
                delta: self.get("delta", d.delta)?,
                alpha: self.get("alpha", d.alpha)?,
                looks: self.get("looks", d.looks)?,
            },
            self.get("budget", 200_000i64)?,
        ))
    }
}

/// A drawn job: its items in order and the suspect's answers.
fn draw<'a>(
    cache: &'a Cache,
    scenario: &Scenario,
    n: usize,
    rng: &mut StdRng,
) -> (Vec<&'a str>, Outcomes) {
    let picks = rand::seq::index::sample(rng, cache.ids.len(), n.min(cache.ids.len()));
    let mut ids = Vec::with_capacity(picks.len());
    let mut out = Vec::with_capacity(picks.len());
    for i in picks {
        let id = cache.ids[i].as_str();
        let (Some(b), Some(s)) = (cache.reference.get(id), cache.suspect(scenario, id, rng)) else {
            continue;
        };
        ids.push(id);
        out.push(Row::of(s, b));
    }
    (ids, out)
}

fn power(args: &Args) -> Result<()> {
    let cache = Cache::load(&args.path("a8")?, &args.path("corrupt")?)?;
    let out = args.path("out")?;
    std::fs::create_dir_all(out.join("verify"))?;
    let (params, budget) = args.params()?;
    let sizes: Vec<usize> = args.list("sizes", "50,100,200,400")?;
    let fractions: Vec<f64> = args.list("fractions", "0.1,0.05")?;
    let jobs: usize = args.get("jobs", 2000)?;
    let verify: usize = args.get("verify", 2)?;
    let verify_size: usize = args.get("verify-size", 200)?;
    let verify_fraction: f64 =
        args.get("verify-fraction", fractions.first().copied().unwrap_or(0.1))?;
    let seed: u64 = args.get("seed", 1)?;
    // seconds per token of the full runs (both sides, concurrency as configured)
    let mut wall_ms = 0i64;
    let mut run_tokens = 0i64;
    for p in args.list::<String>("runs", "")? {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p)?)?;
        wall_ms += v["verdict"]["wall_ms"].as_i64().unwrap_or(0);
        run_tokens += v["verdict"]["tokens"].as_i64().unwrap_or(0);
    }
    let ms_per_token = (run_tokens > 0).then(|| wall_ms as f64 / run_tokens as f64);
    let suite = suite_lines(&args.path("suite")?)?;

    let mut scenarios = vec![Scenario::Reference, Scenario::A8];
    scenarios.extend(fractions.iter().map(|&f| Scenario::Corrupt(f)));
    let pool = pool_summary(&cache);
    let mut rows = Vec::new();
    for (si, scenario) in scenarios.iter().enumerate() {
        for &n in &sizes {
            let mut rng = StdRng::seed_from_u64(seed ^ ((si as u64) << 32) ^ n as u64);
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            let (mut items, mut tokens) = (0usize, 0i64);
            for _ in 0..jobs {
                let (_, o) = draw(&cache, scenario, n, &mut rng);
                let s = simulate(&o, &params, budget);
                *counts.entry(s.verdict.as_str()).or_default() += 1;
                items += s.items;
                tokens += s.tokens;
            }
            let rate = |v: &str| counts.get(v).copied().unwrap_or(0) as f64 / jobs as f64;
            let mean_tokens = tokens as f64 / jobs as f64;
            rows.push(json!({
                "scenario": scenario.name(),
                "items": n.min(cache.ids.len()),
                "jobs": jobs,
                "degraded": rate("degraded"),
                "equivalent": rate("equivalent"),
                "inconclusive": rate("inconclusive"),
                "mean_items_used": items as f64 / jobs as f64,
                "mean_tokens": mean_tokens,
                "est_wall_s": ms_per_token.map(|m| m * mean_tokens / 1000.0),
            }));
        }
        // re-runs: a8, and tool-corrupt at the fraction the harness's endpoint serves
        if !(matches!(scenario, Scenario::A8) || *scenario == Scenario::Corrupt(verify_fraction)) {
            continue;
        }
        for v in 0..verify {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1_000 + v as u64) ^ si as u64);
            let (ids, o) = draw(&cache, scenario, verify_size, &mut rng);
            let name = format!("{}-{v}", scenario.slug());
            let mut f = std::fs::File::create(out.join("verify").join(format!("{name}.jsonl")))?;
            for id in &ids {
                let line = suite
                    .get(*id)
                    .with_context(|| format!("item {id} is not in the suite file"))?;
                writeln!(f, "{line}")?;
            }
            let s = simulate(&o, &params, budget);
            let plan = json!({
                "scenario": scenario.name(),
                "fraction": match scenario { Scenario::Corrupt(f) => json!(f), _ => Value::Null },
                "items": ids,
                "params": {"delta": params.delta, "alpha": params.alpha, "looks": params.looks, "budget": budget},
                "simulated": sim_json(&s),
            });
            std::fs::write(
                out.join("verify").join(format!("{name}.plan.json")),
                serde_json::to_string_pretty(&plan)?,
            )?;
        }
    }
    let doc = json!({
        "pool": pool,
        "reference_mismatches": cache.reference_mismatches,
        "params": {"delta": params.delta, "alpha": params.alpha, "looks": params.looks, "budget": budget},
        "ms_per_token": ms_per_token,
        "rows": rows,
    });
    std::fs::write(out.join("power.json"), serde_json::to_string_pretty(&doc)?)?;
    let md = markdown(&doc);
    std::fs::write(out.join("power.md"), &md)?;
    print!("{md}");
    Ok(())
}

/// Pass rates of the pool per side, and the calls behind the corruption model.
fn pool_summary(c: &Cache) -> Value {
    let rate = |m: &HashMap<String, Answer>| {
        let k = c
            .ids
            .iter()
            .filter(|id| m.get(*id).is_some_and(|a| a.passed))
            .count();
        let valid = c
            .ids
            .iter()
            .filter(|id| m.get(*id).is_some_and(|a| a.valid == Some(true)))
            .count();
        json!({"passed": k, "schema_valid": valid, "of": c.ids.len()})
    };
    let with_calls = c
        .ids
        .iter()
        .filter(|id| c.reference.get(*id).is_some_and(|a| a.calls > 0))
        .count();
    let corrupt_lost = c
        .ids
        .iter()
        .filter(|id| {
            c.reference
                .get(*id)
                .is_some_and(|a| a.passed && a.calls > 0)
                && c.corrupt.get(*id).is_some_and(|a| !a.passed)
        })
        .count();
    json!({
        "items": c.ids.len(),
        "reference": rate(&c.reference),
        "a8": rate(&c.a8),
        "corrupt_every_call": rate(&c.corrupt),
        "reference_items_with_calls": with_calls,
        "reference_passes_lost_when_corrupted": corrupt_lost,
    })
}

fn markdown(doc: &Value) -> String {
    let p = &doc["pool"];
    let mut s = format!(
        "Pool: {} items; passed (schema-valid): reference {} ({}), a8 {} ({}), every call corrupted {} ({}); the reference calls a tool in {} items; corruption loses {} of the reference's passes. Cached reference answers differing between its two runs: {}.\n\n",
        p["items"],
        p["reference"]["passed"],
        p["reference"]["schema_valid"],
        p["a8"]["passed"],
        p["a8"]["schema_valid"],
        p["corrupt_every_call"]["passed"],
        p["corrupt_every_call"]["schema_valid"],
        p["reference_items_with_calls"],
        p["reference_passes_lost_when_corrupted"],
        doc["reference_mismatches"],
    );
    s += "| suspect | items per job | degraded | equivalent | inconclusive | items used (mean) | tokens (mean) | est. wall (s) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in doc["rows"].as_array().into_iter().flatten() {
        let pct = |k: &str| format!("{:.1}%", r[k].as_f64().unwrap_or(0.0) * 100.0);
        s += &format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {} |\n",
            r["scenario"].as_str().unwrap_or(""),
            r["items"],
            pct("degraded"),
            pct("equivalent"),
            pct("inconclusive"),
            r["mean_items_used"].as_f64().unwrap_or(0.0),
            r["mean_tokens"].as_f64().unwrap_or(0.0),
            r["est_wall_s"]
                .as_f64()
                .map_or("—".to_owned(), |w| format!("{w:.0}")),
        );
    }
    s
}

fn sim_json(s: &Simulated) -> Value {
    json!({
        "verdict": s.verdict.as_str(),
        "looks_done": s.looks_done,
        "items": s.items,
        "stopped": s.stopped,
        "tokens": s.tokens,
        "paired": s.paired.to_json(),
        "schema_paired": if s.schema.n() > 0 { s.schema.to_json() } else { Value::Null },
    })
}

/// The suite file's lines by item id.
fn suite_lines(path: &Path) -> Result<HashMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut m = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)?;
        let id = v["id"].as_str().context("a suite line without an id")?;
        m.insert(id.to_owned(), line.to_owned());
    }
    Ok(m)
}

/// Compares a re-run job with the cache and the resampler; fails on any difference.
fn check(args: &Args) -> Result<()> {
    let cache = Cache::load(&args.path("a8")?, &args.path("corrupt")?)?;
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(args.path("plan")?)?)?;
    let job: Value = serde_json::from_str(&std::fs::read_to_string(args.path("job")?)?)?;
    let rows = read_export(&args.path("export")?)?;
    let scenario = match plan["fraction"].as_f64() {
        Some(f) => Scenario::Corrupt(f),
        None => Scenario::A8,
    };
    let ids: Vec<String> = plan["items"]
        .as_array()
        .context("plan.items")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let find = |id: &str, role: &str| rows.iter().find(|r| r.0 == id && r.1 == role);
    let (mut answered, mut corrupted, mut problems) = (0usize, 0usize, Vec::new());
    let mut outcomes = Outcomes::new();
    for id in &ids {
        let (Some(s), Some(b)) = (find(id, "suspect"), find(id, "baseline")) else {
            break; // the job stopped before this item
        };
        answered += 1;
        let reference = cache.reference.get(id).context("item not cached")?;
        if b.2.message != reference.message {
            problems.push(format!("{id}: baseline answer differs from the cached one"));
        }
        let cached = match &scenario {
            Scenario::A8 => cache.a8.get(id).context("item not cached")?,
            _ => reference,
        };
        if s.2.message != cached.message {
            if matches!(scenario, Scenario::Corrupt(_)) {
                corrupted += 1;
                let every = cache.corrupt.get(id).context("item not cached")?;
                if s.2.passed != every.passed {
                    problems.push(format!(
                        "{id}: corrupted answer passed={} but the cached corrupted one {}",
                        s.2.passed, every.passed
                    ));
                }
            } else {
                problems.push(format!("{id}: suspect answer differs from the cached one"));
            }
        }
        outcomes.push(Row::of(&s.2, &b.2));
    }
    let p = &plan["params"];
    let params = VerdictParams {
        delta: p["delta"].as_f64().context("params.delta")?,
        alpha: p["alpha"].as_f64().context("params.alpha")?,
        looks: u32::try_from(p["looks"].as_u64().context("params.looks")?)?,
    };
    let budget = p["budget"].as_i64().context("params.budget")?;
    // the sequential rule over the re-run's outcomes, padded with the items it never ran
    // (their outcomes cannot matter: the rule stopped before them)
    let mut full = outcomes.clone();
    let blank = Row {
        suspect: true,
        baseline: true,
        suspect_valid: None,
        baseline_valid: None,
        tokens: 0,
    };
    full.resize(ids.len(), blank);
    let s = simulate(&full, &params, budget);
    let v = &job["verdict"];
    let worker = json!({
        "verdict": v["verdict"], "looks_done": v["looks_done"], "items": v["items"],
        "stopped": v["stopped"], "paired": v["paired"],
        "schema_paired": v["schema_validity"]["paired"],
    });
    let mine = sim_json(&s);
    for k in [
        "verdict",
        "looks_done",
        "items",
        "stopped",
        "paired",
        "schema_paired",
    ] {
        if worker[k] != mine[k] {
            problems.push(format!(
                "{k}: worker {} vs resampler {}",
                worker[k], mine[k]
            ));
        }
    }
    if matches!(scenario, Scenario::A8) && plan["simulated"]["verdict"] != mine["verdict"] {
        problems.push(format!(
            "a8 planned verdict {} vs re-run {}",
            plan["simulated"]["verdict"], mine["verdict"]
        ));
    }
    let line = json!({
        "plan": args.path("plan")?.display().to_string(),
        "scenario": scenario.name(),
        "answered": answered,
        "corrupted": corrupted,
        "worker": worker,
        "problems": problems,
    });
    println!("{line}");
    if !problems.is_empty() {
        bail!("the re-run differs from the cache: {problems:?}");
    }
    Ok(())
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = argv
        .split_first()
        .context("usage: verdict_power power|check ...")?;
    let args = Args::parse(rest)?;
    match cmd.as_str() {
        "power" => power(&args),
        "check" => check(&args),
        other => bail!("unknown command {other:?} (power, check)"),
    }
}
