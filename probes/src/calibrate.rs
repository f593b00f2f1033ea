//! Measuring a model's calibration ladder (`samewise calibrate`): the reference engine scores a
//! fixed corpus unmodified and under each degradation level (weights re-quantized to 8, 6, 5,
//! 4, 3, 2 bits; 8-bit activations), and every position is compared over the full vocabulary.
//!
//! Per position and level: the full-vocabulary KL(reference ‖ level) ([`compare::kl_full`]),
//! and the top-k view an endpoint would report ([`compare::position_from_full_logprobs`])
//! compared exactly as a logprob probe compares an endpoint ([`compare::compare_position`]), so
//! the ladder's `kl_topk_mean`, `dlogprob_mean`, `top1_same` and `topk_overlap` measure what
//! the probes measure. Logits come one sequence at a time
//! ([`samewise_engine::Engine::score_logits_into`], into two reused buffers): memory is two
//! sequences' logits and the reference's probabilities, not the corpus's. What every level
//! compares against — the reference row's log-sum-exp, probabilities and top-k — is computed
//! once per position, not once per level. The engines load concurrently. The result is a
//! [`Ladder`].
//!
//! The corpus ships in the repository (`probes/data/calibration/*.txt`, compiled in:
//! [`builtin_corpus`]); a user's own is a directory of `.txt` files ([`read_corpus`]).
//!
//! [`Ladder`]: crate::ladder::Ladder
//! [`builtin_corpus`]: crate::calibrate::builtin_corpus
//! [`read_corpus`]: crate::calibrate::read_corpus

use std::path::Path;

use samewise_engine::Profile;
use samewise_engine::Tokenizer;
use samewise_engine::{Engine, LoadOptions};

use crate::compare::{self, PositionMetrics};
use crate::ladder::{Ladder, Level, LevelKind};
use crate::{ProbesError, Result};

/// The levels measured unless told otherwise, most bits first.
pub const DEFAULT_LEVELS: &[&str] = &["w8", "w6", "w5", "w4", "w3", "w2", "a8"];
/// k of the top-k statistics (the probes' default `top_k`).
pub const DEFAULT_TOP_K: usize = 5;
/// Name recorded for the built-in corpus.
pub const BUILTIN_CORPUS_NAME: &str = "probes/data/calibration";

/// One text of a calibration corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusText {
    /// File name.
    pub name: String,
    /// The text.
    pub text: String,
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrateOptions {
    /// Kernel threads of each engine, and threads comparing positions.
    pub threads: usize,
    /// k of the top-k statistics.
    pub top_k: usize,
    /// Built-in profile names of the levels (`w8`..`w2`, `a8`).
    pub levels: Vec<String>,
    /// Score only the first this-many tokens of each text (a quick subset); None: all.
    pub max_tokens_per_text: Option<usize>,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        Self {
            threads: 2,
            top_k: DEFAULT_TOP_K,
            levels: DEFAULT_LEVELS.iter().map(|s| (*s).to_owned()).collect(),
            max_tokens_per_text: None,
        }
    }
}

/// Progress of a calibration, reported after each (text, level) pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Texts finished.
    pub texts_done: usize,
    /// Texts in all.
    pub texts: usize,
    /// Positions compared so far (per level).
    pub positions: usize,
}

/// The corpus shipped in the repository (`probes/data/calibration/`), in file-name order.
pub fn builtin_corpus() -> Vec<CorpusText> {
    macro_rules! text {
        ($f:literal) => {
            CorpusText {
                name: $f.to_owned(),
                text: include_str!(concat!("../data/calibration/", $f)).to_owned(),
            }
        };
    }
    vec![
        text!("01_story.txt"),
        text!("02_science.txt"),
        text!("03_code_rust.rs.txt"),
        text!("04_code_python.py.txt"),
        text!("05_chat.txt"),
        text!("06_multilingual.txt"),
        text!("07_numbers.txt"),
        text!("08_structured.txt"),
        text!("09_howto.txt"),
        text!("10_history.txt"),
    ]
}

/// A model's identity in a ladder: its name (`name`, else the file or directory name without
/// extension) and the sha256 of its weights (the GGUF file, or every `.safetensors` file of an
/// HF directory in name order), so a ladder is never applied to other weights.
pub fn model_identity(path: &Path, name: Option<String>) -> Result<(String, String)> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let io = |p: &Path, source: std::io::Error| ProbesError::Io {
        context: p.display().to_string(),
        source,
    };
    let mut files = Vec::new();
    if path.is_dir() {
        for e in std::fs::read_dir(path).map_err(|e| io(path, e))? {
            let p = e.map_err(|e| io(path, e))?.path();
            if p.is_file() && p.extension().is_some_and(|x| x == "safetensors") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let mut file = std::fs::File::open(&f).map_err(|e| io(&f, e))?;
        loop {
            let n = file.read(&mut buf).map_err(|e| io(&f, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    let name = name.unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    Ok((name, format!("{:x}", h.finalize())))
}

/// A corpus from a directory: every `*.txt` file, in file-name order. Errors when there is none
/// or one cannot be read.
pub fn read_corpus(dir: &Path) -> Result<Vec<CorpusText>> {
    let io = |source: std::io::Error| ProbesError::Io {
        context: format!("calibration corpus {}", dir.display()),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_file() && path.extension().is_some_and(|x| x == "txt") {
            names.push(path);
        }
    }
    names.sort();
    if names.is_empty() {
        return Err(ProbesError::NoFiles(format!(
            "calibration corpus {}: no .txt files",
            dir.display()
        )));
    }
    names
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).map_err(io)?;
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok(CorpusText { name, text })
        })
        .collect()
}

/// Tokenizes a corpus with the model's own tokenizer (no special tokens added; special-token
/// text such as `<|im_start|>` in a transcript is read as those tokens).
pub fn tokenize_corpus(model: &Path, corpus: &[CorpusText]) -> Result<Vec<Vec<u32>>> {
    let tok = if model.is_dir() {
        Tokenizer::from_hf_dir(model)
    } else {
        samewise_engine::GgufFile::open(model).and_then(|g| Tokenizer::from_gguf(&g))
    }
    .map_err(|source| ProbesError::Engine {
        context: format!("tokenizer of {}", model.display()),
        source,
    })?;
    corpus
        .iter()
        .map(|t| {
            tok.encode(&t.text, false)
                .map_err(|source| ProbesError::Engine {
                    context: format!("tokenizing {}", t.name),
                    source,
                })
        })
        .collect()
}

/// Kind and bits of a ladder level, from its built-in profile.
fn level_kind(name: &str) -> Result<(Profile, LevelKind, u32)> {
    let p =
        Profile::builtin(name).ok_or_else(|| crate::invalid(format!("unknown level {name:?}")))?;
    let only_weights = p.activations.is_none() && p.kv_cache.is_none();
    let (kind, bits) = match (&p.weights, &p.activations) {
        (Some(w), None) if only_weights => (LevelKind::Weights, u32::from(w.quant.bits)),
        (None, Some(a)) if p.kv_cache.is_none() => (LevelKind::Activations, u32::from(a.bits)),
        _ => {
            return Err(crate::invalid(format!(
                "level {name:?} is neither a weights level (w8..w2) nor an activations level (a8)"
            )));
        }
    };
    Ok((p, kind, bits))
}

fn engine_err(what: &str) -> impl Fn(samewise_engine::EngineError) -> ProbesError + '_ {
    move |source| ProbesError::Engine {
        context: what.to_owned(),
        source,
    }
}

/// One sequence's logit rows (`[positions][vocab]`) into `out`, whose allocation is reused
/// from sequence to sequence.
fn rows(engine: &Engine, seq: &[u32], what: &str, out: &mut Vec<f32>) -> Result<()> {
    engine.score_logits_into(seq, out).map_err(engine_err(what))
}

/// `one(p)` for every `p` in `0..n`, in order, split over `threads` contiguous ranges.
fn par_positions<T: Send>(
    n: usize,
    threads: usize,
    one: &(dyn Fn(usize) -> Result<T> + Sync),
) -> Result<Vec<T>> {
    let per = n.div_ceil(threads.max(1)).max(1);
    let parts: Vec<Result<Vec<T>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(per)
            .map(|start| s.spawn(move || (start..(start + per).min(n)).map(one).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::invalid("a comparison thread panicked")))
            })
            .collect()
    });
    let mut out = Vec::with_capacity(n);
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// What every level's comparison needs of one reference row, computed once per position
/// instead of once per (position, level): its log-sum-exp (the row's logprobs are
/// `f64::from(logit) - lse`, exactly what [`compare::log_softmax`] computes), its
/// probabilities `exp(logprob)` (the weights of the full KL) and its top-k view.
struct ReferenceRow {
    lse: f64,
    probs: Vec<f64>,
    top: Vec<compare::TopEntry>,
}

/// The reference rows of one sequence: raw logits (`[positions][vocab]`) and per position a
/// [`ReferenceRow`].
struct Reference {
    logits: Vec<f32>,
    rows: Vec<ReferenceRow>,
}

impl Reference {
    fn new(logits: Vec<f32>, vocab: usize, top_k: usize, threads: usize) -> Result<Self> {
        let n = logits.len() / vocab;
        let rows = par_positions(n, threads, &|p| {
            let row = &logits[p * vocab..(p + 1) * vocab];
            let lse = compare::log_sum_exp(row)?;
            // exactly compare::log_softmax(row)
            let lp: Vec<f64> = row.iter().map(|&l| f64::from(l) - lse).collect();
            let top = compare::top_k_ids(&lp, top_k)
                .into_iter()
                .map(|i| compare::TopEntry {
                    id: i as u32,
                    logprob: lp[i],
                })
                .collect();
            Ok(ReferenceRow {
                lse,
                probs: lp.iter().map(|a| a.exp()).collect(),
                top,
            })
        })?;
        Ok(Self { logits, rows })
    }
}

/// Compares one sequence's rows: per position (full KL, probe metrics), split over `threads`.
/// Bit for bit what [`compare::kl_from_logprobs`], [`compare::position_from_full_logprobs`]
/// and [`compare::compare_position`] give on the two rows' log-softmaxes, with the reference
/// side's part taken from `reference`.
fn compare_rows(
    reference: &Reference,
    level: &[f32],
    seq: &[u32],
    vocab: usize,
    top_k: usize,
    threads: usize,
) -> Result<Compared> {
    let n = reference.rows.len();
    if level.len() != n * vocab {
        return Err(crate::invalid(
            "a level scored a different number of positions",
        ));
    }
    par_positions(n, threads, &|p| {
        let (r, rr) = (
            &reference.logits[p * vocab..(p + 1) * vocab],
            &reference.rows[p],
        );
        let ll = compare::log_softmax(&level[p * vocab..(p + 1) * vocab])?;
        let kl = r
            .iter()
            .zip(&rr.probs)
            .zip(&ll)
            .map(|((&l, &pr), &b)| pr * ((f64::from(l) - rr.lse) - b))
            .sum::<f64>()
            .max(0.0);
        let actual = seq[p + 1];
        let a = actual as usize;
        let input = compare::PositionInput {
            actual_id: actual,
            reference: compare::Side {
                actual_logprob: f64::from(r[a]) - rr.lse,
                top: rr.top.clone(),
            },
            endpoint: compare::Side {
                actual_logprob: ll[a],
                top: compare::top_k_ids(&ll, top_k)
                    .into_iter()
                    .map(|i| compare::TopEntry {
                        id: i as u32,
                        logprob: ll[i],
                    })
                    .collect(),
            },
        };
        Ok((kl, compare::compare_position(&input)?))
    })
}

/// A measured level: name, kind, bits and its engine.
type LevelEngine = (String, LevelKind, u32, Engine);

/// One sequence's positions compared: (full KL, probe metrics) per position.
type Compared = Vec<(f64, PositionMetrics)>;

/// One sequence under every level, compared with `reference`, in level order. One thread per
/// buffer of `bufs` takes the next level not yet taken until none is left: scores it into its
/// buffer and compares the rows on its own.
fn score_levels(
    levels: &[LevelEngine],
    reference: &Reference,
    seq: &[u32],
    vocab: usize,
    top_k: usize,
    bufs: &mut [Vec<f32>],
) -> Result<Vec<Compared>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<Compared>)> = std::thread::scope(|s| {
        let handles: Vec<_> = bufs
            .iter_mut()
            .map(|buf| {
                let next = &next;
                s.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some((name, _, _, engine)) = levels.get(j) else {
                            break;
                        };
                        let compared = rows(engine, seq, &format!("scoring under {name}"), buf)
                            .and_then(|()| compare_rows(reference, buf, seq, vocab, top_k, 1));
                        let failed = compared.is_err();
                        out.push((j, compared));
                        if failed {
                            break;
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join().unwrap_or_else(|_| {
                    vec![(usize::MAX, Err(crate::invalid("a level thread panicked")))]
                })
            })
            .collect()
    });
    done.sort_by_key(|(j, _)| *j);
    let mut out = Vec::with_capacity(levels.len());
    for (_, compared) in done {
        out.push(compared?);
    }
    if out.len() != levels.len() {
        return Err(crate::invalid("a level was not scored"));
    }
    Ok(out)
}

/// Measures the ladder of the model at `model` over `seqs` (token ids; see
/// [`tokenize_corpus`]). `model_name`, `model_sha256` and `corpus_name` are recorded as given.
pub fn calibrate(
    model: &Path,
    model_name: &str,
    model_sha256: &str,
    corpus_name: &str,
    seqs: &[Vec<u32>],
    opts: &CalibrateOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Ladder> {
    if opts.top_k == 0 || opts.top_k > samewise_engine::MAX_TOP_K {
        return Err(crate::invalid(format!(
            "top_k must be within 1..={}",
            samewise_engine::MAX_TOP_K
        )));
    }
    if opts.levels.is_empty() {
        return Err(crate::invalid("no levels to measure"));
    }
    let seqs: Vec<&[u32]> = seqs
        .iter()
        .map(|s| &s[..opts.max_tokens_per_text.map_or(s.len(), |m| m.min(s.len()))])
        .filter(|s| s.len() >= 2)
        .collect();
    if seqs.is_empty() {
        return Err(crate::invalid(
            "the corpus has no text of two tokens or more",
        ));
    }
    // the reference runs alone on every kernel thread; the levels run side by side, one
    // engine per thread (no kernel thread waits on another; a result does not depend on the
    // thread count)
    let load = |(profile, threads): (Profile, usize)| {
        let what = format!("loading {} under {}", model.display(), profile.name);
        Engine::load(
            model,
            LoadOptions {
                threads,
                profile,
                ..LoadOptions::default()
            },
        )
        .map_err(engine_err(&what))
    };
    let kinds = opts
        .levels
        .iter()
        .map(|name| level_kind(name))
        .collect::<Result<Vec<_>>>()?;
    // every engine loads (and re-quantizes) on its own thread, so the loads share the cores
    let mut profiles = vec![(Profile::default(), opts.threads)];
    profiles.extend(kinds.iter().map(|(p, _, _)| (p.clone(), 1)));
    let mut engines = std::thread::scope(|s| {
        let handles: Vec<_> = profiles
            .into_iter()
            .map(|p| s.spawn(move || load(p)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::invalid("a loading thread panicked")))
            })
            .collect::<Result<Vec<Engine>>>()
    })?
    .into_iter();
    let reference = engines
        .next()
        .ok_or_else(|| crate::invalid("no reference engine"))?;
    let vocab = reference.config().vocab_size;
    let levels: Vec<LevelEngine> = opts
        .levels
        .iter()
        .zip(kinds)
        .zip(engines)
        .map(|((name, (_, kind, bits)), engine)| (name.clone(), kind, bits, engine))
        .collect();
    let mut measured: Vec<(Vec<f64>, Vec<PositionMetrics>)> =
        vec![(Vec::new(), Vec::new()); levels.len()];
    let mut positions = 0;
    let mut ref_buf = Vec::new();
    let mut level_bufs = vec![Vec::new(); opts.threads.min(levels.len()).max(1)];
    for (i, seq) in seqs.iter().enumerate() {
        rows(&reference, seq, "scoring with the reference", &mut ref_buf)?;
        let r = Reference::new(
            std::mem::take(&mut ref_buf),
            vocab,
            opts.top_k,
            opts.threads,
        )?;
        let per_level = score_levels(&levels, &r, seq, vocab, opts.top_k, &mut level_bufs)?;
        for ((kls, metrics), compared) in measured.iter_mut().zip(per_level) {
            for (kl, m) in compared {
                kls.push(kl);
                metrics.push(m);
            }
        }
        ref_buf = r.logits;
        positions += seq.len() - 1;
        progress(Progress {
            texts_done: i + 1,
            texts: seqs.len(),
            positions,
        });
    }
    let mut out = Vec::with_capacity(levels.len());
    for ((name, kind, bits, _), (kls, metrics)) in levels.iter().zip(&measured) {
        let s = compare::summarize(metrics)?;
        out.push(Level {
            name: name.clone(),
            kind: *kind,
            bits: *bits,
            kl_mean: kls.iter().sum::<f64>() / kls.len() as f64,
            kl_p99: compare::quantile_nearest_rank(kls, 0.99)?,
            kl_topk_mean: s.kl_mean,
            dlogprob_mean: s.abs_dlogprob_mean,
            top1_same: s.top1_same,
            topk_overlap: s.topk_overlap,
        });
    }
    let ladder = Ladder {
        model: model_name.to_owned(),
        model_sha256: model_sha256.to_owned(),
        corpus: corpus_name.to_owned(),
        positions: positions as u64,
        top_k: opts.top_k as u32,
        levels: out,
    };
    ladder.validate()?;
    Ok(ladder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_corpus_is_the_data_directory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/calibration");
        assert_eq!(read_corpus(&dir).unwrap(), builtin_corpus());
    }

    #[test]
    fn level_names_map_to_kinds_and_bits() {
        assert_eq!(
            level_kind("w4").map(|(_, k, b)| (k, b)).unwrap(),
            (LevelKind::Weights, 4)
        );
        assert_eq!(
            level_kind("a8").map(|(_, k, b)| (k, b)).unwrap(),
            (LevelKind::Activations, 8)
        );
        assert!(level_kind("kv-q8").is_err());
        assert!(level_kind("flaky").is_err());
        assert!(level_kind("nope").is_err());
    }

    #[test]
    fn an_empty_corpus_directory_is_an_error() {
        let dir =
            std::env::temp_dir().join(format!("samewise-empty-corpus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            read_corpus(&dir)
                .unwrap_err()
                .to_string()
                .contains("no .txt files")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
