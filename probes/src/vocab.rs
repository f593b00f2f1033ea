//! The engine's tokenizer as the probes' [`ReferenceVocab`]: token ids by their bytes or
//! display text, the reference tokenization, and token bytes; plus loading a tokenizer from
//! a local file (GGUF, Hugging Face directory, or `tokenizer.json`) for the remote and
//! external reference backends, which align tokens locally, and the model's chat template
//! beside it for a backend whose server cannot render chats (SGLang); and rendering a chat
//! with a template, as the in-process reference does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use samewise_engine::GgufFile;
use samewise_engine::Tokenizer;
use samewise_engine::chat::{self, ChatTemplate};
use serde_json::Value;

use crate::align::ReferenceVocab;
use crate::{ProbesError, Result};

/// A reference vocabulary backed by the engine's [`Tokenizer`].
pub struct EngineVocab {
    tokenizer: Arc<Tokenizer>,
    by_bytes: HashMap<Vec<u8>, u32>,
    by_text: HashMap<String, u32>,
}

impl std::fmt::Debug for EngineVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineVocab")
            .field("tokens", &self.tokenizer.vocab_size())
            .finish_non_exhaustive()
    }
}

impl EngineVocab {
    /// Indexes every token of `tokenizer`. Where two ids share bytes, an ordinary token wins
    /// over a special one, then the lower id. A display text that several ordinary tokens
    /// share (the lossy U+FFFD rendering of different partial characters) names none of
    /// them: mapping it to one would silently score a different sequence.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let n = tokenizer.vocab_size();
        let mut by_bytes = HashMap::with_capacity(n);
        let mut by_text: HashMap<String, Option<u32>> = HashMap::with_capacity(n);
        // ordinary tokens first, so they win over special tokens with the same bytes
        for pass_special in [false, true] {
            for id in 0..n as u32 {
                if tokenizer.is_special(id) != pass_special {
                    continue;
                }
                if let Ok(b) = tokenizer.token_bytes(id) {
                    by_bytes.entry(b.to_vec()).or_insert(id);
                }
                if let Ok(t) = tokenizer.token_str(id) {
                    match by_text.entry(t.to_owned()) {
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(Some(id));
                        }
                        std::collections::hash_map::Entry::Occupied(mut o) => {
                            if !pass_special {
                                o.insert(None);
                            }
                        }
                    }
                }
            }
        }
        let by_text = by_text
            .into_iter()
            .filter_map(|(t, id)| Some((t, id?)))
            .collect();
        Self {
            tokenizer,
            by_bytes,
            by_text,
        }
    }

    /// Loads a tokenizer from a GGUF file, a Hugging Face directory, or a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let err = |source: samewise_engine::EngineError| ProbesError::Engine {
            context: format!("tokenizer {}", path.display()),
            source,
        };
        let tok = if path.is_dir() {
            Tokenizer::from_hf_dir(path).map_err(err)?
        } else if path.extension().is_some_and(|e| e == "json") {
            Tokenizer::from_json_file(path).map_err(err)?
        } else {
            let gguf = GgufFile::open(path).map_err(err)?;
            Tokenizer::from_gguf(&gguf).map_err(err)?
        };
        Ok(Self::new(Arc::new(tok)))
    }

    /// The tokenizer behind it.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }
}

/// The chat template of the model at `path` (a GGUF file, a Hugging Face directory, or a
/// `tokenizer.json` whose directory holds the template, as Hugging Face lays them out),
/// compiled with `tokenizer`'s bos and eos texts; why not, where there is none or it does not
/// compile.
pub fn load_chat_template(
    path: &Path,
    tokenizer: &Tokenizer,
) -> std::result::Result<ChatTemplate, String> {
    let shown = path.display();
    let src = if path.is_dir() {
        chat::template_from_hf_dir(path)
    } else if path.extension().is_some_and(|e| e == "json") {
        chat::template_from_hf_dir(path.parent().unwrap_or(Path::new(".")))
    } else {
        GgufFile::open(path).map(|g| chat::template_from_gguf(&g))
    }
    .map_err(|e| format!("reading the chat template of {shown}: {e}"))?
    .ok_or_else(|| {
        format!(
            "{shown} holds no chat template (give the model's GGUF file or Hugging Face directory)"
        )
    })?;
    ChatTemplate::new(
        &src,
        tokenizer.bos_token().unwrap_or_default(),
        tokenizer.eos_token().unwrap_or_default(),
    )
    .map_err(|e| format!("the chat template of {shown}: {e}"))
}

/// `messages` (with `tools`) rendered by `template` with the generation prompt, and tokenized
/// as the template's text stands (no special tokens added: the template writes its own).
pub fn render_chat_ids(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Value],
    tools: Option<&[Value]>,
) -> samewise_engine::Result<Vec<u32>> {
    let text = template.render(messages, tools, true, None)?;
    tokenizer.encode(&text, false)
}

impl ReferenceVocab for EngineVocab {
    fn id_of_text(&self, t: &str) -> Option<u32> {
        self.by_text.get(t).copied()
    }

    fn id_of_bytes(&self, b: &[u8]) -> Option<u32> {
        self.by_bytes.get(b).copied()
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, false).unwrap_or_default()
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer
            .token_bytes(id)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }
}
