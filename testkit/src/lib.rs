//! samewise-testkit: test doubles for the third parties samewise talks to, speaking their real
//! protocols over real loopback sockets.
//!
//! It owns [`MockUpstream`], an OpenAI-protocol provider (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`, streaming and not) that records every request it receives
//! and misbehaves on demand from a scripted queue of [`Behavior`]s. It must not depend on any
//! samewise crate: it is an independent implementation of the provider side of the protocol,
//! so a bug in our own wire types cannot hide itself in both ends of a test.
//!
//! # Layout
//! - `mock`: [`MockUpstream`], its builder, the accept loop and request recording.
//! - `behavior`: [`Behavior`], [`Reply`], [`ToolCall`]: what the mock answers.
//! - `chaos`: [`Chaos`], a seeded stream of faults (resets, stalls, slow-loris bodies, 5xx and
//!   429 storms, garbage) a mock answers from in chaos runs.
//! - `render`: the OpenAI JSON and SSE bodies for a parsed request and a reply.
//! - [`fixtures`]: where the test model and the HF fixture are ([`fixtures::test_model`]),
//!   one rule for every crate's tests and benchmarks.
//! - `http1`: a small hand-written HTTP/1.1 server side (keep-alive, chunked bodies), so the
//!   mock can reset connections, split writes and stall at exact byte offsets.
//! - [`webdriver`]: a tiny W3C WebDriver client over `reqwest` for browser tests against
//!   a real headless Chromium ([`webdriver::ChromeDriver`], [`webdriver::Browser`]).

mod behavior;
mod chaos;
/// A namespace of the API: `fixtures::test_model`, `fixtures::hf_fixture_dir`.
pub mod fixtures;
mod http1;
mod mock;
mod render;
/// A namespace of the API: the WebDriver client (`webdriver::ChromeDriver`, `webdriver::Browser`).
pub mod webdriver;

pub use behavior::{Behavior, LogprobsMode, Reply, ToolCall};
pub use chaos::{Chaos, ChaosTimes};
pub use mock::{MockUpstream, MockUpstreamBuilder, RecordedRequest};

/// Everything that can go wrong while starting or driving a test double.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// The listener could not be bound (the address is taken or not local).
    #[error("cannot bind the mock upstream on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// Waiting for requests to arrive ran past its deadline.
    #[error("timed out waiting for {wanted} request(s) at the mock upstream; {seen} arrived")]
    WaitTimeout {
        /// How many requests the caller waited for.
        wanted: usize,
        /// How many had arrived at the deadline.
        seen: usize,
    },
    /// The browser or its driver failed (not installed, refused a command, ...).
    #[error("webdriver: {0}")]
    WebDriver(String),
}
