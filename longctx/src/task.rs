//! The tasks: RULER-style (Hsieh et al., 2024) synthetic long-context items.
//!
//! A [`Group`] is one haystack of one task at one length — filler sentences with the task's
//! needles at seeded depths, then a question — followed by one or more answers, each a
//! [`Query`] (one scored item). Every answer is written out after its *lead* (e.g.
//! `"\napple:"`), so a group's answers are teacher-forced one after the other in the same
//! prompt: one prompt per candidate scores every query of the group, and a distractor prompt
//! puts a distractor in every answer slot. Later answers never reveal earlier ones (each
//! query asks about different needles).
//!
//! | task | needles | queries | answer |
//! |---|---|---|---|
//! | `single_needle` | 1 (key → number) | 1 | the number |
//! | `multi_key` | 4 keys, one asked | 1 | the asked key's number |
//! | `multi_value` | 4 numbers for one key | 1 | all four, in order |
//! | `multi_query` | one per query | ⌊L/64⌋ clamped to 2..=16 | `key: number`, one per line |
//! | `variable_tracking` | a chain of 5 assignments | 1 | the 5 variable names |
//!
//! Distractors have the answer's form and appear nowhere in the group's text: numbers of
//! the same digits; for list answers (multi-value, variable tracking), the true list with
//! one element replaced, a different element per distractor (see `one_replaced`). Sizing is
//! two-phase, so this module stays free of IO: [`Draft::texts`] lists what to count with the
//! model's tokenizer; [`Draft::build`] fills each haystack with whole filler sentences up to
//! the length minus the group's fixed text (header, needles, question, answers).
//!
//! [`Draft::texts`]: crate::task::Draft::texts
//! [`Draft::build`]: crate::task::Draft::build

use serde::Deserialize;

use crate::rng::{Rng, mix};
use crate::{LongctxError, Result};

const BUILTIN: &str = include_str!("../data/haystack.json");

const NUMBERS_HEADER: &str = "Some special magic numbers are hidden within the following text. \
Make sure to memorize them. I will quiz you about the numbers afterwards.\n";
const VT_HEADER: &str =
    "Memorize and track the chain of variable assignments hidden in the following text.\n";
/// Numbers in one multi-value needle set.
const MULTI_VALUES: usize = 4;
/// Keys in a multi-key haystack (one asked).
const MULTI_KEYS: usize = 4;
/// Variables in a variable-tracking chain.
const VT_CHAIN: usize = 5;
/// Tokens of length per multi-query query.
const TOKENS_PER_QUERY: u32 = 64;
/// Most queries of one multi-query group.
const MAX_QUERIES: usize = 16;

/// The five tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskKind {
    /// One needle, one question.
    SingleNeedle,
    /// Several keys' needles; the question names one.
    MultiKey,
    /// Several numbers for one key; the answer lists them all.
    MultiValue,
    /// Several keys' needles; every key asked, one answer per line.
    MultiQuery,
    /// A chain of variable assignments; the answer names every variable holding the value.
    VariableTracking,
}

impl TaskKind {
    /// Every task, in a fixed order.
    pub const ALL: [TaskKind; 5] = [
        TaskKind::SingleNeedle,
        TaskKind::MultiKey,
        TaskKind::MultiValue,
        TaskKind::MultiQuery,
        TaskKind::VariableTracking,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::SingleNeedle => "single_needle",
            TaskKind::MultiKey => "multi_key",
            TaskKind::MultiValue => "multi_value",
            TaskKind::MultiQuery => "multi_query",
            TaskKind::VariableTracking => "variable_tracking",
        }
    }

    /// The task named `s`.
    pub fn parse(s: &str) -> Option<TaskKind> {
        TaskKind::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Queries of one group at `length` tokens.
    pub fn queries(self, length: u32) -> usize {
        match self {
            TaskKind::MultiQuery => ((length / TOKENS_PER_QUERY) as usize).clamp(2, MAX_QUERIES),
            _ => 1,
        }
    }
}

/// The haystack text: filler sentences and needle keys (`data/haystack.json`, or a user's
/// file of the same shape).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Haystack {
    /// What the file is, for people reading it.
    pub description: String,
    /// Filler sentences, repeated in order (cycling).
    pub filler: Vec<String>,
    /// Words used as needle keys (at least 16 + 4, all distinct).
    pub keys: Vec<String>,
}

impl Haystack {
    /// The built-in haystack.
    pub fn builtin() -> Result<Haystack> {
        Haystack::from_json(BUILTIN)
    }

    /// Parses and checks a haystack file's text.
    pub fn from_json(text: &str) -> Result<Haystack> {
        let h: Haystack =
            serde_json::from_str(text).map_err(|e| LongctxError::Data(e.to_string()))?;
        h.validate()?;
        Ok(h)
    }

    /// Checks the haystack can build every task.
    pub fn validate(&self) -> Result<()> {
        if self.filler.is_empty() || self.filler.iter().any(|s| s.trim().is_empty()) {
            return Err(LongctxError::Data(
                "filler needs at least one non-empty sentence".into(),
            ));
        }
        let mut keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() != self.keys.len() || keys.len() < MAX_QUERIES + MULTI_KEYS {
            return Err(LongctxError::Data(format!(
                "keys must be at least {} distinct words",
                MAX_QUERIES + MULTI_KEYS
            )));
        }
        if self.keys.iter().any(|k| {
            k.is_empty()
                || !k
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '-' || c == '_')
        }) {
            return Err(LongctxError::Data(
                "keys must be single words (letters, digits, - or _)".into(),
            ));
        }
        Ok(())
    }
}

/// What to build.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Tasks, one group per task and length.
    pub tasks: Vec<TaskKind>,
    /// The shortest length (tokens); lengths double up to `window`.
    pub start_tokens: u32,
    /// The longest length (tokens), included even when not a doubling of the start.
    pub window: u32,
    /// Distractor answers per query (K).
    pub distractors: usize,
    /// Digits of a needle's number.
    pub digits: usize,
    /// Seed of every choice (keys, numbers, depths, filler start, distractors).
    pub seed: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tasks: TaskKind::ALL.to_vec(),
            start_tokens: 256,
            window: 1024,
            distractors: 3,
            digits: 5,
            seed: 0,
        }
    }
}

/// The lengths tried: `start`, doubling, below `window`, then `window` itself.
pub fn lengths(start: u32, window: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut n = start.max(1);
    while n < window {
        out.push(n);
        n = n.saturating_mul(2);
    }
    if window > 0 {
        out.push(window);
    }
    out
}

/// One scored item: an answer slot of a group.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Unique within a suite: `task/length/index`.
    pub id: String,
    /// The text before the answer (starts a new line).
    pub lead: String,
    /// The true answer, with its leading space.
    pub answer: String,
    /// Distractor answers of the same form, with their leading spaces.
    pub distractors: Vec<String>,
    /// What a generated answer must contain, all of it (RULER's `string_match_all`).
    pub expected: Vec<String>,
    /// Depth of the answer's shallowest needle (0 = the haystack's start, 1 = its end).
    pub depth: f64,
}

/// One haystack of one task at one length, and its queries.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// `task/length`.
    pub id: String,
    /// The task.
    pub task: TaskKind,
    /// The nominal length (tokens of the whole prompt with its true answers).
    pub length: u32,
    /// Header, haystack with needles, question: everything before the first lead.
    pub prompt: String,
    /// The answer slots, in prompt order.
    pub queries: Vec<Query>,
    /// The tokens the sizing counted for the whole true prompt.
    pub tokens: usize,
}

impl Group {
    /// Candidates per query: the true answer and the distractors.
    pub fn candidates(&self) -> usize {
        1 + self
            .queries
            .iter()
            .map(|q| q.distractors.len())
            .min()
            .unwrap_or(0)
    }

    /// The answer of `q` in candidate `c` (0: the true answer; c: distractor c − 1).
    fn candidate_answer(q: &Query, c: usize) -> &str {
        if c == 0 {
            &q.answer
        } else {
            q.distractors.get(c - 1).map_or("", String::as_str)
        }
    }

    /// Prompt of candidate `c` — every answer slot holding that candidate — and the byte
    /// ranges of the answers in it, one per query.
    pub fn candidate_prompt(&self, c: usize) -> (String, Vec<std::ops::Range<usize>>) {
        let mut text = self.prompt.clone();
        let mut spans = Vec::with_capacity(self.queries.len());
        for q in &self.queries {
            text.push_str(&q.lead);
            let start = text.len();
            text.push_str(Self::candidate_answer(q, c));
            spans.push(start..text.len());
        }
        (text, spans)
    }

    /// The prompts of generation scoring: for query j, the prompt, the true answers of the
    /// queries before it, and its lead.
    pub fn generation_prompts(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.queries.len());
        let mut text = self.prompt.clone();
        for q in &self.queries {
            out.push(format!("{text}{}", q.lead));
            text.push_str(&q.lead);
            text.push_str(&q.answer);
        }
        out
    }

    /// Tokens a generated answer needs (the longest true answer's characters, a bound on
    /// its tokens, plus room).
    pub fn generation_max_tokens(&self) -> u32 {
        let longest = self
            .queries
            .iter()
            .map(|q| q.answer.chars().count())
            .max()
            .unwrap_or(0);
        u32::try_from(longest).unwrap_or(u32::MAX).saturating_add(4)
    }
}

/// A group before sizing.
#[derive(Debug, Clone)]
struct DraftGroup {
    task: TaskKind,
    length: u32,
    header: &'static str,
    /// Needle sentences with their depths, in the order they appear.
    needles: Vec<(f64, String)>,
    question: String,
    queries: Vec<Query>,
    filler_start: usize,
}

impl DraftGroup {
    /// Header, needles, question and true answers: what is not filler.
    fn fixed_text(&self) -> String {
        let mut s = self.header.to_owned();
        for (_, n) in &self.needles {
            s.push(' ');
            s.push_str(n);
        }
        s.push_str(&self.question);
        for q in &self.queries {
            s.push_str(&q.lead);
            s.push_str(&q.answer);
        }
        s
    }
}

/// Groups drafted from settings, waiting for token counts.
#[derive(Debug, Clone)]
pub struct Draft {
    filler: Vec<String>,
    groups: Vec<DraftGroup>,
}

/// A random number of `digits` digits (no leading zero) not in `taken`; added to it.
fn fresh_number(rng: &mut Rng, digits: usize, taken: &mut Vec<String>) -> String {
    loop {
        let mut s = String::with_capacity(digits);
        s.push(char::from(b'1' + rng.below(9) as u8));
        for _ in 1..digits {
            s.push(char::from(b'0' + rng.below(10) as u8));
        }
        if !taken.contains(&s) {
            taken.push(s.clone());
            return s;
        }
    }
}

/// A random 5-letter upper-case name not in `taken`; added to it.
fn fresh_name(rng: &mut Rng, taken: &mut Vec<String>) -> String {
    loop {
        let s: String = (0..5)
            .map(|_| char::from(b'A' + rng.below(26) as u8))
            .collect();
        if !taken.contains(&s) {
            taken.push(s.clone());
            return s;
        }
    }
}

/// `n` depths, one drawn uniformly in each of `n` equal strata of [0, 1], ascending.
fn stratified(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|i| (i as f64 + rng.unit()) / n as f64).collect()
}

/// `k` distractor lists of a list answer: each is `list` with one element replaced by a
/// fresh one of the same form, the replaced positions cycling from a seeded start. A list
/// answer is judged element by element: a list of wholly random elements would lose to
/// the true list even with most of its needles lost (measured: by 17 to 37 nats with half
/// the haystack cut), one wrong element does only when that element's needle is kept.
fn one_replaced(
    rng: &mut Rng,
    list: &[String],
    k: usize,
    mut fresh: impl FnMut(&mut Rng, &mut Vec<String>) -> String,
    taken: &mut Vec<String>,
) -> Vec<Vec<String>> {
    let start = rng.below(list.len());
    (0..k)
        .map(|j| {
            let mut l = list.to_vec();
            if !l.is_empty() {
                let at = (start + j) % l.len();
                l[at] = fresh(rng, taken);
            }
            l
        })
        .collect()
}

fn number_needle(key: &str, value: &str) -> String {
    format!("One of the special magic numbers for {key} is: {value}.")
}

impl Draft {
    /// Drafts one group per task and length.
    pub fn new(haystack: &Haystack, s: &Settings) -> Result<Draft> {
        haystack.validate()?;
        // at least 9,000 numbers for the ≤ 16 values and ≤ 16 × 16 distractors of a group
        if !(4..=12).contains(&s.digits) {
            return Err(LongctxError::Data("digits must be in 4..=12".into()));
        }
        if s.distractors > 16 {
            return Err(LongctxError::Data("at most 16 distractors".into()));
        }
        if s.distractors == 0 {
            return Err(LongctxError::Data(
                "at least one distractor is needed".into(),
            ));
        }
        if s.tasks.is_empty() {
            return Err(LongctxError::Data("no task selected".into()));
        }
        let mut groups = Vec::new();
        for &task in &s.tasks {
            for length in lengths(s.start_tokens, s.window) {
                let seed = mix(&[s.seed, task as u64, u64::from(length)]);
                groups.push(draft_group(haystack, s, task, length, seed));
            }
        }
        Ok(Draft {
            filler: haystack.filler.clone(),
            groups,
        })
    }

    /// The texts to count with the model's tokenizer (no special tokens): each filler
    /// sentence with its leading space, then each group's fixed text.
    pub fn texts(&self) -> Vec<String> {
        let mut out: Vec<String> = self.filler.iter().map(|f| format!(" {f}")).collect();
        for g in &self.groups {
            let t = g.fixed_text();
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// Builds the groups, `count` giving the token count of every text of
    /// [`Draft::texts`].
    pub fn build(self, count: impl Fn(&str) -> Option<usize>) -> Result<Vec<Group>> {
        let need = |t: &str| count(t).ok_or(LongctxError::Uncounted(t.chars().count()));
        let mut per_sentence = Vec::with_capacity(self.filler.len());
        for f in &self.filler {
            per_sentence.push(need(&format!(" {f}"))?);
        }
        let mut out = Vec::with_capacity(self.groups.len());
        for g in self.groups {
            let fixed = need(&g.fixed_text())?;
            let budget = (g.length as usize).saturating_sub(fixed);
            let mut sentences: Vec<&str> = Vec::new();
            let mut used = 0usize;
            let n = self.filler.len();
            loop {
                let i = (g.filler_start + sentences.len()) % n;
                let c = per_sentence[i].max(1);
                if used + c > budget {
                    break;
                }
                used += c;
                sentences.push(&self.filler[i]);
            }
            // needles go in from the deepest, so earlier insertions do not move later ones
            let mut parts: Vec<&str> = sentences.clone();
            let total = sentences.len();
            for (depth, needle) in g.needles.iter().rev() {
                let at = ((depth * total as f64).round() as usize).min(total);
                parts.insert(at, needle);
            }
            let prompt = format!("{}{}{}", g.header, parts.join(" "), g.question);
            out.push(Group {
                id: format!("{}/{}", g.task.as_str(), g.length),
                task: g.task,
                length: g.length,
                prompt,
                queries: g.queries,
                tokens: fixed + used,
            });
        }
        Ok(out)
    }
}

fn draft_group(h: &Haystack, s: &Settings, task: TaskKind, length: u32, seed: u64) -> DraftGroup {
    let mut rng = Rng::new(seed);
    let filler_start = rng.below(h.filler.len());
    let mut keys = h.keys.clone();
    rng.shuffle(&mut keys);
    let mut taken: Vec<String> = Vec::new();
    let id = |j: usize| format!("{}/{length}/{j}", task.as_str());
    let k = s.distractors;
    let d = s.digits;
    let (header, needles, question, queries) = match task {
        TaskKind::SingleNeedle | TaskKind::MultiKey => {
            let n = if task == TaskKind::SingleNeedle {
                1
            } else {
                MULTI_KEYS
            };
            let depths = stratified(&mut rng, n);
            let values: Vec<String> = (0..n)
                .map(|_| fresh_number(&mut rng, d, &mut taken))
                .collect();
            let asked = rng.below(n);
            let key = keys[asked].clone();
            let needles = (0..n)
                .map(|i| (depths[i], number_needle(&keys[i], &values[i])))
                .collect();
            let question = format!(
                "\n\nWhat is the special magic number for {key} mentioned in the provided text?"
            );
            let q = Query {
                id: id(0),
                lead: format!(
                    "\nThe special magic number for {key} mentioned in the provided text is:"
                ),
                answer: format!(" {}", values[asked]),
                distractors: (0..k)
                    .map(|_| format!(" {}", fresh_number(&mut rng, d, &mut taken)))
                    .collect(),
                expected: vec![values[asked].clone()],
                depth: depths[asked],
            };
            (NUMBERS_HEADER, needles, question, vec![q])
        }
        TaskKind::MultiValue => {
            let key = keys[0].clone();
            let depths = stratified(&mut rng, MULTI_VALUES);
            let values: Vec<String> = (0..MULTI_VALUES)
                .map(|_| fresh_number(&mut rng, d, &mut taken))
                .collect();
            let needles = depths
                .iter()
                .zip(&values)
                .map(|(&dp, v)| (dp, number_needle(&key, v)))
                .collect();
            let question = format!(
                "\n\nWhat are all the special magic numbers for {key} mentioned in the provided text?"
            );
            let q = Query {
                id: id(0),
                lead: format!(
                    "\nThe special magic numbers for {key} mentioned in the provided text are:"
                ),
                answer: format!(" {}", values.join(", ")),
                distractors: one_replaced(
                    &mut rng,
                    &values,
                    k,
                    |r, t| fresh_number(r, d, t),
                    &mut taken,
                )
                .into_iter()
                .map(|l| format!(" {}", l.join(", ")))
                .collect(),
                expected: values,
                depth: depths[0],
            };
            (NUMBERS_HEADER, needles, question, vec![q])
        }
        TaskKind::MultiQuery => {
            let n = task.queries(length);
            let depths = stratified(&mut rng, n);
            let values: Vec<String> = (0..n)
                .map(|_| fresh_number(&mut rng, d, &mut taken))
                .collect();
            let needles = (0..n)
                .map(|i| (depths[i], number_needle(&keys[i], &values[i])))
                .collect();
            // asked in a seeded order, not the needles' order
            let mut order: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut order);
            let queries = order
                .iter()
                .enumerate()
                .map(|(j, &i)| Query {
                    id: id(j),
                    lead: format!("\n{}:", keys[i]),
                    answer: format!(" {}", values[i]),
                    distractors: (0..k)
                        .map(|_| format!(" {}", fresh_number(&mut rng, d, &mut taken)))
                        .collect(),
                    expected: vec![values[i].clone()],
                    depth: depths[i],
                })
                .collect();
            let question =
                "\n\nThe special magic numbers for the keys mentioned in the provided text are:"
                    .to_owned();
            (NUMBERS_HEADER, needles, question, queries)
        }
        TaskKind::VariableTracking => {
            let value = fresh_number(&mut rng, d, &mut taken);
            let names: Vec<String> = (0..VT_CHAIN)
                .map(|_| fresh_name(&mut rng, &mut taken))
                .collect();
            let depths = stratified(&mut rng, VT_CHAIN);
            let needles = (0..VT_CHAIN)
                .map(|i| {
                    let rhs = if i == 0 {
                        value.clone()
                    } else {
                        format!("VAR {}", names[i - 1])
                    };
                    (depths[i], format!("VAR {} = {rhs}.", names[i]))
                })
                .collect();
            let question = format!(
                "\n\nQuestion: Find all variables that are assigned the value {value} in the text above."
            );
            let q = Query {
                id: id(0),
                lead: format!(
                    " Answer: According to the chain of variable assignments in the text above, {VT_CHAIN} variables are assigned the value {value}, they are:"
                ),
                answer: format!(" {}", names.join(" ")),
                distractors: one_replaced(&mut rng, &names, k, fresh_name, &mut taken)
                    .into_iter()
                    .map(|l| format!(" {}", l.join(" ")))
                    .collect(),
                expected: names,
                depth: depths[0],
            };
            (VT_HEADER, needles, question, vec![q])
        }
    };
    DraftGroup {
        task,
        length,
        header,
        needles,
        question,
        queries,
        filler_start,
    }
}

#[cfg(test)]
mod tests;
