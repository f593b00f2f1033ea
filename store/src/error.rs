//! The store's error type. Each variant says which operation failed in the caller's terms
//! ("inserting request records", "connecting to PostgreSQL at ..."), and no variant ever
//! carries a password: URLs are passed through [`redact_url`] before they are stored.

use std::path::PathBuf;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL is not one the store understands.
    #[error("invalid database URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with its password replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The data directory for the default SQLite file could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory that was to hold `samewise.db`.
        path: PathBuf,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// A command that reads what a gateway stored found no SQLite database where it looked
    /// ([`crate::Store::open_from_env`]).
    #[error("no samewise database at {}", path.display())]
    NoDatabase {
        /// Where the SQLite file was looked for.
        path: PathBuf,
    },
    /// The database could not be reached or opened.
    #[error("cannot connect to {backend} at {url}: {detail}")]
    Connect {
        /// "PostgreSQL" or "SQLite".
        backend: &'static str,
        /// The URL with its password replaced by `***`.
        url: String,
        /// The driver's message, with the password scrubbed out.
        detail: String,
    },
    /// A schema migration failed or the database's schema is not one this build knows.
    #[error("migrating the {backend} schema failed: {detail}")]
    Migrate {
        /// "PostgreSQL" or "SQLite".
        backend: &'static str,
        /// What failed: the migration's version and name and the driver's message.
        detail: String,
    },
    /// A statement failed.
    #[error("{op} failed: {source}")]
    Query {
        /// What the caller asked for, e.g. "inserting request records".
        op: &'static str,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// `create_api_key` was given a name that a live (unrevoked) key already has.
    #[error("an API key named {0:?} already exists")]
    KeyNameTaken(String),
    /// The caller passed a value the store refuses (empty key name, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A value read back does not fit its Rust type (the database was edited by hand).
    #[error("corrupt value in column {column}: {detail}")]
    Corrupt {
        /// The column holding the value.
        column: &'static str,
        /// The value and why it does not fit.
        detail: String,
    },
    /// The operating system's random number generator failed (creating a key).
    #[error("the OS random number generator failed: {0}")]
    Random(String),
}

impl StoreError {
    /// Wraps a driver error for the operation `op`.
    pub(crate) fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |source| StoreError::Query { op, source }
    }

    /// True when the database is away rather than refusing this statement: it cannot be
    /// reached (connection refused, reset or timed out, no pooled connection in time), is
    /// shutting down or starting up (SQLSTATE class 08, 57P01-57P03, 53300 too many
    /// connections), or has no room (PostgreSQL 53100 disk full; SQLite FULL, IOERR, BUSY,
    /// LOCKED, CANTOPEN). The same statement may succeed later, unchanged: the record writer
    /// waits these out. A closed pool is not one (it was closed on purpose).
    pub fn is_unavailable(&self) -> bool {
        let source = match self {
            StoreError::Connect { .. } => return true,
            StoreError::Query { source, .. } => source,
            _ => return false,
        };
        match source {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                if code.len() == 5 {
                    // a PostgreSQL SQLSTATE (SQLite's codes have at most 4 digits)
                    code.starts_with("08")
                        || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300" | "53100")
                } else {
                    // a SQLite result code (extended codes keep the primary one in the low byte)
                    code.parse::<i32>()
                        .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14))
                }
            }
            _ => false,
        }
    }
}

/// Returns `url` with any password (in the userinfo or as a `password=` query parameter)
/// replaced by `***`, fit for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..rest_start]);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[authority_len..];
    match tail.find('?') {
        Some(q) => {
            out.push_str(&tail[..=q]);
            let query = &tail[q + 1..];
            let (query, fragment) = match query.find('#') {
                Some(h) => (&query[..h], &query[h..]),
                None => (query, ""),
            };
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
            out.push_str(fragment);
        }
        None => out.push_str(tail),
    }
    out
}

/// The password part of `url`, if any, so that driver messages can be scrubbed of it.
pub(crate) fn url_password(url: &str) -> Option<String> {
    let scheme_end = url.find("://")?;
    let rest = &url[scheme_end + 3..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let userinfo = &authority[..authority.rfind('@')?];
    let (_, password) = userinfo.split_once(':')?;
    if password.is_empty() {
        None
    } else {
        Some(password.to_owned())
    }
}

/// Replaces every occurrence of the URL's password in `message` by `***`.
pub(crate) fn scrub(message: String, url: &str) -> String {
    match url_password(url) {
        Some(password) => message.replace(&password, "***"),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_userinfo_password() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/samewise"),
            "postgres://app:***@db:5432/samewise"
        );
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(
            redact_url("postgres://db/x?user=a&password=hunter2&sslmode=disable"),
            "postgres://db/x?user=a&password=***&sslmode=disable"
        );
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(redact_url("sqlite::memory:"), "sqlite::memory:");
    }

    #[test]
    fn scrubs_password_from_messages() {
        let url = "postgres://app:s3cret@db/x";
        assert_eq!(url_password(url).as_deref(), Some("s3cret"));
        assert_eq!(scrub("bad s3cret here".into(), url), "bad *** here");
        assert_eq!(url_password("postgres://app@db/x"), None);
    }
}
