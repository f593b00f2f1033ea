//! `[server]`: where the gateway listens and how it serves, read here and checked with errors
//! that name the key and line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::Validator;
use crate::ProxyError;
use crate::cors::Cors;

/// Most serving threads `[server] threads` may ask for.
const MAX_THREADS: u64 = 1024;

/// The default of `[server] threads`: one per CPU the process may use.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the gateway listens.
    pub listen: SocketAddr,
    /// Largest request body accepted; larger ones get 413.
    pub body_limit_bytes: usize,
    /// Where the embedded SQLite database lives when `DATABASE_URL` is unset (relative paths
    /// are relative to the working directory).
    pub data_dir: PathBuf,
    /// How often the gateway re-reads the active alerts to demote or exclude endpoints
    /// (`alert_poll_ms`, default 2 s).
    pub alert_poll: Duration,
    /// After the shutdown signal, how long open requests and streams may take to finish
    /// before their connections are closed and the gateway exits anyway (`drain_timeout_ms`,
    /// default 30 s; 0 closes them at once).
    pub drain_timeout: Duration,
    /// How many threads serve HTTP (`threads`, default one per CPU): each runs its own
    /// single-threaded runtime and accepts on the shared listener, so a request is served on
    /// one thread from accept to answer (see [`crate::serve_router_with`]).
    pub threads: usize,
    /// The origins whose browser pages may call the OpenAI routes (`cors_allow_origins`,
    /// default none; `"*"` for every origin): see `crate::cors`.
    pub cors: Option<Arc<Cors>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    listen: Option<Spanned<String>>,
    body_limit_bytes: Option<Spanned<u64>>,
    data_dir: Option<String>,
    alert_poll_ms: Option<Spanned<u64>>,
    drain_timeout_ms: Option<u64>,
    threads: Option<Spanned<u64>>,
    cors_allow_origins: Option<Spanned<Origins>>,
}

/// `cors_allow_origins`: a list, or one origin as a string.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "server.cors_allow_origins: a list of origins such as [\"https://chat.example.com\"], \
                 or one origin as a string"
)]
enum Origins {
    One(String),
    Many(Vec<String>),
}

impl Validator<'_> {
    pub(super) fn server(&self, raw: RawServer) -> Result<ServerConfig, ProxyError> {
        let listen = match raw.listen {
            None => SocketAddr::from(([127, 0, 0, 1], 8080)),
            Some(s) => match s.get_ref().parse::<SocketAddr>() {
                Ok(a) => a,
                Err(_) => {
                    return self.err(
                        "server.listen",
                        Some(s.span()),
                        "must be an address like \"127.0.0.1:8080\"",
                    );
                }
            },
        };
        let body_limit_bytes = match raw.body_limit_bytes {
            None => 10 * 1024 * 1024,
            Some(s) if *s.get_ref() == 0 => {
                return self.err(
                    "server.body_limit_bytes",
                    Some(s.span()),
                    "must be greater than 0",
                );
            }
            Some(s) => usize::try_from(*s.get_ref()).unwrap_or(usize::MAX),
        };
        let data_dir = PathBuf::from(raw.data_dir.unwrap_or_else(|| "samewise-data".to_owned()));
        let alert_poll = self.positive_ms("server.alert_poll_ms", raw.alert_poll_ms, 2_000)?;
        let drain_timeout =
            self.bounded_ms("server.drain_timeout_ms", raw.drain_timeout_ms, 30_000)?;
        let threads = match raw.threads {
            None => default_threads(),
            Some(s) if !(1..=MAX_THREADS).contains(s.get_ref()) => {
                return self.err(
                    "server.threads",
                    Some(s.span()),
                    format!("must be between 1 and {MAX_THREADS}"),
                );
            }
            Some(s) => usize::try_from(*s.get_ref()).unwrap_or(1),
        };
        let cors = match raw.cors_allow_origins {
            None => None,
            Some(s) => match Cors::from_list(match s.get_ref() {
                Origins::One(o) => std::slice::from_ref(o),
                Origins::Many(list) => list,
            }) {
                Ok(cors) => cors.map(Arc::new),
                Err((i, why)) => {
                    return self.err(
                        format!("server.cors_allow_origins[{i}]"),
                        Some(s.span()),
                        why,
                    );
                }
            },
        };
        Ok(ServerConfig {
            listen,
            body_limit_bytes,
            data_dir,
            alert_poll,
            drain_timeout,
            threads,
            cors,
        })
    }
}
