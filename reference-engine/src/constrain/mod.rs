//! Constrained decoding: the output is held, token by token, to a grammar compiled from a
//! JSON Schema (OpenAI's `response_format`) or from the request's tools (`tool_choice`
//! `"required"` or a named function).
//!
//! Pipeline: a [`Spec`] is compiled ([`compile`], [`schema`]) into a [`Grammar`] once and kept
//! in a [`GrammarCache`] (LRU, by the spec's canonical JSON); a [`Constraint`] pairs it with the
//! vocabulary's [`TokenTrie`] (built once per tokenizer); each generated sequence runs its
//! own [`Matcher`], which gives the allowed-token mask before each step and advances by the
//! chosen token's bytes. The engine samples over the masked logits (greedy: the argmax of
//! the allowed tokens; sampling: the masked distribution, renormalised) but reports the
//! model's own, unmasked logprobs.
//!
//! Tool calls are written in the engine's tools convention ([`crate::chat`]): one
//! `<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>` per call, calls separated by
//! a newline ([`CALL_PREFIX`], [`CALL_MID`], [`CALL_SUFFIX`], [`CALL_SEP`]).
//!
//! [`ToolSplitter`] reads forced calls back out of the text, as it is generated.
//!
//! Layout: `calls` (the splitter), [`grammar`](crate::constrain::grammar) (nodes and the byte-level pushdown
//! automaton; `grammar::depth`, the heights that keep every reading completable within its
//! depth bound; `grammar::props`, an object's property sets as bits), `lexeme` (its string
//! and number readers), [`schema`] (JSON Schema to nodes), [`vocab`] (the token trie and
//! mask walk).
//!
//! [`Spec`]: crate::constrain::Spec
//! [`compile`]: crate::constrain::compile
//! [`schema`]: crate::constrain::schema
//! [`Grammar`]: crate::constrain::Grammar
//! [`GrammarCache`]: crate::constrain::GrammarCache
//! [`Constraint`]: crate::constrain::Constraint
//! [`TokenTrie`]: crate::constrain::TokenTrie
//! [`Matcher`]: crate::constrain::Matcher
//! [`CALL_PREFIX`]: crate::constrain::CALL_PREFIX
//! [`CALL_MID`]: crate::constrain::CALL_MID
//! [`CALL_SUFFIX`]: crate::constrain::CALL_SUFFIX
//! [`CALL_SEP`]: crate::constrain::CALL_SEP
//! [`vocab`]: crate::constrain::vocab
//! [`ToolSplitter`]: crate::constrain::ToolSplitter

mod calls;
pub mod grammar;
mod lexeme;
pub mod schema;
pub mod vocab;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use calls::{ToolEvent, ToolSplitter};
pub use grammar::{Grammar, Node, NodeId, State};
pub use schema::SchemaError;
pub use vocab::{TokenSet, TokenTrie};

/// What opens each tool call.
pub const CALL_PREFIX: &str = "<tool_call>{\"name\": \"";
/// Between the name and the arguments.
pub const CALL_MID: &str = "\", \"arguments\": ";
/// What closes each tool call.
pub const CALL_SUFFIX: &str = "}</tool_call>";
/// Between two calls.
pub const CALL_SEP: &str = "\n";
/// Most calls in one answer when parallel calls are allowed.
pub const MAX_PARALLEL_CALLS: usize = 8;
/// Longest compile allowed (a 400 past it).
pub const MAX_COMPILE_TIME: Duration = Duration::from_secs(2);
/// Compiled grammars kept by a [`GrammarCache`].
pub const CACHE_CAPACITY: usize = 64;
/// Masks a [`Matcher`] remembers (by state).
const MASK_CACHE: usize = 64;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A JSON value: any JSON object when `schema` is None (JSON mode), else an instance of
    /// the schema.
    Json {
        /// The JSON Schema.
        schema: Option<Value>,
    },
    /// Tool calls of the declared functions.
    Tools {
        /// Each function's name and parameters schema (None: no arguments, `{}`).
        functions: Vec<(String, Option<Value>)>,
        /// One or more calls (else exactly one).
        parallel: bool,
    },
}

impl Spec {
    /// The tool calls a forced `tool_choice` asks for: the functions of `tools` (OpenAI-shaped
    /// definitions) named in `only` (every one when None), each with its parameters schema.
    /// A name outside `^[a-zA-Z0-9_-]{1,64}$` is refused, the message naming it.
    pub fn forced_tools(
        tools: &[Value],
        only: Option<&[&str]>,
        parallel: bool,
    ) -> Result<Spec, String> {
        let mut functions = Vec::new();
        for t in tools {
            let Some(name) = t.pointer("/function/name").and_then(Value::as_str) else {
                continue;
            };
            if only.is_some_and(|only| !only.contains(&name)) {
                continue;
            }
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(format!(
                    "function name {name:?} must match ^[a-zA-Z0-9_-]{{1,64}}$"
                ));
            }
            let params = t
                .pointer("/function/parameters")
                .filter(|p| !p.is_null())
                .cloned();
            functions.push((name.to_owned(), params));
        }
        Ok(Spec::Tools {
            functions,
            parallel,
        })
    }

    /// The cache key: canonical JSON of the spec.
    pub fn key(&self) -> String {
        match self {
            Spec::Json { schema } => json!({"json": schema}).to_string(),
            Spec::Tools { functions, parallel } => {
                json!({"tools": functions.iter().map(|(n, p)| json!([n, p])).collect::<Vec<_>>(), "parallel": parallel})
                    .to_string()
            }
        }
    }
}

/// Compiles a spec into a grammar; refusals name the keyword or limit at fault.
pub fn compile(spec: &Spec) -> Result<Grammar, SchemaError> {
    let t0 = Instant::now();
    let mut g = Grammar::new();
    let root = match spec {
        Spec::Json { schema: None } => g.push(Node::Obj(Box::new(grammar::ObjSpec {
            keys: Vec::new(),
            values: Vec::new(),
            required: 0,
            additional: Some(Grammar::ANY),
        }))),
        Spec::Json { schema: Some(s) } => {
            schema::Compiler::new(&mut g).compile(s, "response_format.json_schema.schema")?
        }
        Spec::Tools {
            functions,
            parallel,
        } => {
            if functions.is_empty() {
                return Err(SchemaError("no functions to call".into()));
            }
            let mut named = Vec::new();
            for (i, (name, params)) in functions.iter().enumerate() {
                let at = format!("tools[{i}].function.parameters");
                let args = match params {
                    None => g.push(Node::Lit((*b"{}").into())),
                    Some(p) => {
                        let id = schema::Compiler::for_tool_arguments(&mut g).compile(p, &at)?;
                        if id == Grammar::ANY {
                            g.push(Node::Obj(Box::new(grammar::ObjSpec {
                                keys: Vec::new(),
                                values: Vec::new(),
                                required: 0,
                                additional: Some(Grammar::ANY),
                            })))
                        } else if matches!(g.nodes.get(id as usize), Some(Node::Obj(_))) {
                            id
                        } else {
                            return Err(SchemaError(format!(
                                "{at}: parameters must be a JSON Schema of type \"object\""
                            )));
                        }
                    }
                };
                named.push((format!("{name}{CALL_MID}").into_bytes().into(), args));
            }
            let prefix = g.push(Node::Lit(CALL_PREFIX.as_bytes().into()));
            let suffix = g.push(Node::Lit(CALL_SUFFIX.as_bytes().into()));
            // one reading for all functions, however many (an Alt keeps MAX_STACKS readings)
            let which = g.switch(named);
            let call = g.push(Node::Seq([prefix, which, suffix].into()));
            let mut calls = call;
            if *parallel {
                // call (sep call (sep call ...)?)? up to MAX_PARALLEL_CALLS, built from the end
                let sep = g.push(Node::Lit(CALL_SEP.as_bytes().into()));
                let nothing = g.push(Node::Seq(Box::new([])));
                let mut tail = nothing;
                for _ in 1..MAX_PARALLEL_CALLS {
                    let more = g.push(Node::Seq([sep, call, tail].into()));
                    tail = g.push(Node::Alt([nothing, more].into()));
                }
                calls = g.push(Node::Seq([call, tail].into()));
            }
            calls
        }
    };
    g.root = root;
    g.seal();
    if t0.elapsed() > MAX_COMPILE_TIME {
        return Err(SchemaError(format!(
            "schema took longer than {MAX_COMPILE_TIME:?} to compile"
        )));
    }
    if g.start().is_dead() {
        return Err(SchemaError(format!(
            "the schema admits no value nested at most {} deep",
            grammar::MAX_DEPTH
        )));
    }
    Ok(g)
}

/// Compiled grammars by spec key, least recently used dropped first.
#[derive(Debug, Default)]
pub struct GrammarCache {
    entries: Mutex<VecDeque<(String, Arc<Grammar>)>>,
}

impl GrammarCache {
    /// The grammar for `spec`, compiled on a miss. Also says whether it was a hit.
    pub fn get(&self, spec: &Spec) -> Result<(Arc<Grammar>, bool), SchemaError> {
        let key = spec.key();
        {
            let mut e = self
                .entries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(i) = e.iter().position(|(k, _)| *k == key)
                && let Some(hit) = e.remove(i)
            {
                let g = Arc::clone(&hit.1);
                e.push_front(hit);
                return Ok((g, true));
            }
        }
        let g = Arc::new(compile(spec)?);
        let mut e = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        e.push_front((key, Arc::clone(&g)));
        e.truncate(CACHE_CAPACITY);
        Ok((g, false))
    }
}

/// A grammar over a vocabulary: what a constrained generation needs.
#[derive(Debug, Clone)]
pub struct Constraint {
    /// The compiled grammar.
    pub grammar: Arc<Grammar>,
    /// The vocabulary's token trie.
    pub trie: Arc<TokenTrie>,
}

/// One sequence's walk through a constraint.
#[derive(Debug)]
pub struct Matcher {
    c: Constraint,
    state: State,
    /// Reused buffers of the mask walk.
    scratch: Vec<State>,
    /// Recent masks by state (string bodies repeat the same state).
    cache: HashMap<State, TokenSet>,
    /// The mask of the current state.
    mask: TokenSet,
    /// Whether `mask` is for the current state.
    fresh: bool,
}

impl Matcher {
    /// A matcher at the start of the output.
    pub fn new(c: Constraint) -> Self {
        let state = c.grammar.start();
        let mask = TokenSet::new(c.trie.vocab());
        Self {
            c,
            state,
            scratch: Vec::new(),
            cache: HashMap::new(),
            mask,
            fresh: false,
        }
    }

    /// The tokens allowed next (stop tokens included once the output is whole).
    pub fn allowed(&mut self) -> &TokenSet {
        if !self.fresh {
            if let Some(m) = self.cache.get(&self.state) {
                self.mask.clone_from(m);
            } else {
                self.c.trie.fill_mask(
                    &self.c.grammar,
                    &self.state,
                    &mut self.mask,
                    &mut self.scratch,
                );
                if self.cache.len() >= MASK_CACHE {
                    self.cache.clear();
                }
                self.cache.insert(self.state.clone(), self.mask.clone());
            }
            self.fresh = true;
        }
        &self.mask
    }

    /// Advances by token `t`; false (state unchanged) if its bytes are not allowed. A stop
    /// token is accepted only when the output is whole, and does not change the state.
    pub fn accept(&mut self, t: u32) -> bool {
        if self.c.trie.is_stop(t) {
            return self.state.can_finish(&self.c.grammar);
        }
        let bytes = self.c.trie.token_bytes(t);
        if bytes.is_empty() {
            return false;
        }
        let mut next = self.state.clone();
        if !next.advance_all(&self.c.grammar, bytes) {
            return false;
        }
        self.state = next;
        self.fresh = false;
        true
    }

    /// Whether the output so far is a whole instance.
    pub fn can_finish(&self) -> bool {
        self.state.can_finish(&self.c.grammar)
    }

    /// Whether the output is whole and nothing can follow: the generation is over.
    pub fn is_complete(&self) -> bool {
        self.can_finish() && !self.state.can_continue(&self.c.grammar)
    }
}

#[cfg(test)]
mod tests;
