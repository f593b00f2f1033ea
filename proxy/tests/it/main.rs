//! The gateway's integration tests, one test binary (one link of tokio, axum, sqlx and reqwest,
//! not one per file): a real proxy on a loopback port in front of mock providers
//! (samewise-testkit), a real store (PostgreSQL and SQLite) and real HTTP clients.
//!
//! Layout: `common` and `checks` are the two rigs; every other module is one area (forwarding,
//! failover, the hung provider (ejection, adaptive timeout, hedging), routing, quality routing,
//! keys and input, lifecycle, the store going away under load (outage), tool calls,
//! degeneration, the official openai client, browsers on other origins (cors)).

mod checks;
mod common;

mod cors;
mod degeneration;
mod failover;
mod forwarding;
mod hung;
mod keys_and_input;
mod lifecycle;
mod openai_client;
mod outage;
mod quality_routing;
mod routing;
mod tool_calls;
