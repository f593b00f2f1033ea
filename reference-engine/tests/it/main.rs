//! The reference engine's integration tests, one test binary: loading (GGUF, safetensors),
//! tokenizer and chat templates against committed goldens, fidelity against transformers' logprobs,
//! batch invariance, serving profiles, the OpenAI-compatible server over real sockets and its
//! sampling parameters, and synthetic models (the GGUF writer, seeded weights, layer cuts).
//!
//! Layout: `common` says where the test model and the committed fixtures are; every other module
//! is one area.

mod common;

mod chat_template;
mod constrained;
mod device;
mod fidelity;
mod invariance;
mod loading;
mod profiles_numerics;
mod profiles_server;
mod sampling;
mod server;
mod server_models;
mod synth;
mod tokenizer;
