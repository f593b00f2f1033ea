//! The engine's one error type. Every failure that bad input can cause (a file that is not
//! a model, a truncated or hostile GGUF, an unsupported architecture, a token id outside
//! the vocabulary, a sequence longer than the context) is a typed variant here; nothing in
//! the crate panics on input.

use std::path::PathBuf;

/// Errors from loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Reading a file or directory failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or directory that could not be read.
        path: PathBuf,
        /// The underlying OS error.
        source: std::io::Error,
    },
    /// Writing a file failed (a GGUF being written, a synthesized model).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file that could not be written.
        path: PathBuf,
        /// The underlying OS error.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic (or is too short to hold it).
    #[error("not a GGUF file: {0}")]
    NotGguf(String),
    /// The GGUF version is one this engine does not read (only v2 and v3 are).
    #[error("unsupported GGUF version {0} (only 2 and 3 are supported)")]
    UnsupportedVersion(u32),
    /// The file ends before a structure it declares.
    #[error("truncated model file: {0}")]
    Truncated(String),
    /// A count, length, offset or shape in the file is impossible.
    #[error("corrupt model file: {what}")]
    Corrupt {
        /// What is wrong, naming the field.
        what: String,
    },
    /// A tensor uses a ggml type this engine cannot dequantize.
    #[error("tensor {tensor}: unsupported tensor type {type_name}")]
    UnsupportedTensorType {
        /// The tensor's name.
        tensor: String,
        /// The ggml type's name or number.
        type_name: String,
    },
    /// The model's architecture is not a Llama-family decoder this engine runs.
    #[error("unsupported architecture {0:?} (supported: llama, mistral, qwen2, qwen3)")]
    UnsupportedArchitecture(String),
    /// A metadata key the model needs is missing or has the wrong type.
    #[error("model metadata: missing or invalid key {0}")]
    MissingMetadata(String),
    /// A tensor the model needs is missing.
    #[error("model is missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has a shape the configuration does not allow.
    #[error("tensor {tensor} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The tensor's name.
        tensor: String,
        /// Its shape in the file.
        actual: Vec<usize>,
        /// The shape the configuration implies.
        expected: Vec<usize>,
    },
    /// A Hugging Face model directory is malformed (config.json, safetensors, index).
    #[error("Hugging Face model directory: {0}")]
    InvalidHf(String),
    /// A token id is not in the vocabulary.
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfVocab {
        /// The offending id.
        token: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A sequence (plus any tokens to generate) is longer than the context window.
    #[error("sequence of {len} tokens exceeds the context window of {n_ctx} tokens")]
    SequenceTooLong {
        /// Tokens needed.
        len: usize,
        /// The context window.
        n_ctx: usize,
    },
    /// A request holds no tokens (or no sequences).
    #[error("empty input: {0}")]
    EmptyInput(String),
    /// A request parameter is out of range.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The tokenizer could not be built (unsupported GGUF tokenizer, bad tokenizer.json)
    /// or failed on input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template failed to parse or to render (including its own `raise_exception`).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The batcher's worker has stopped.
    /// The GPU backend cannot run or failed (no CUDA, no such device, out of device
    /// memory, a kernel error).
    #[error("GPU: {0}")]
    Device(String),
    #[error("the engine worker has shut down")]
    Shutdown,
    /// A serving profile is not TOML of the profile's shape.
    #[error("profile {source_name}: {message}")]
    ProfileParse {
        /// The file or built-in name.
        source_name: String,
        /// What the parser said (it names the key and line).
        message: String,
    },
    /// A serving profile's value is out of range.
    #[error("profile {source_name}: {message}")]
    ProfileInvalid {
        /// The file or built-in name.
        source_name: String,
        /// Which field and why.
        message: String,
    },
    /// Neither a built-in profile name nor a readable file.
    #[error("unknown profile {0:?}: not a built-in ({list}) and not a readable file", list = crate::profile::BUILTIN_NAMES.join(", "))]
    UnknownProfile(String),
}

/// The crate's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    /// Shorthand for [`EngineError::Corrupt`].
    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        Self::Corrupt { what: what.into() }
    }

    /// True for errors caused by the request (bad ids, too long, empty, out of range)
    /// rather than by the model or the engine: the HTTP layer maps these to 400.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::TokenOutOfVocab { .. }
                | Self::SequenceTooLong { .. }
                | Self::EmptyInput(_)
                | Self::InvalidRequest(_)
                | Self::ChatTemplate(_)
        )
    }
}
