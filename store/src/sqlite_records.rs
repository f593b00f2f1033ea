//! The request records' insert on SQLite, through SQLite's C API on the connection sqlx holds.
//!
//! Every request makes a record, so this insert is the gateway's busiest statement. Through
//! sqlx a multi-row `INSERT ... VALUES` cost more than the insert itself: the statement text
//! formatted for every batch, each of a row's 29 values encoded into an argument list, copied
//! again to be sent to sqlx's worker thread, bound by parameter name, copied once more into
//! SQLite and freed when the bindings were cleared (`writer_bench` under callgrind: about
//! 22,000 instructions a row around SQLite's own 15,000; README, "Store writer"). Here the same
//! multi-row statements are prepared on the connection itself, inside the caller's
//! transaction, their texts bound in place without a copy.
//!
//! The connection is locked out of sqlx's worker thread ([`sqlx::sqlite::LockedSqliteHandle`])
//! for the duration, and the statements are prepared and finalized within it. Errors become
//! [`sqlx::Error::Database`] with SQLite's extended result code, as sqlx's own are, so
//! [`crate::StoreError::is_unavailable`] and the writer's row-error isolation read them alike.

use std::borrow::Cow;
use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr::{self, NonNull};

use libsqlite3_sys as ffi;
use sqlx::error::{DatabaseError, ErrorKind};

use crate::RequestRecord;
use crate::probe_runs::text;
use crate::records::COLUMNS;

/// The values bound per row, in [`COLUMNS`] order.
const VALUES: usize = 29;

/// Inserts `rows` on `conn`, which must be inside a transaction (the caller commits or rolls
/// back); for each row, whether it was inserted (false: a row with its `(request_id, attempt)`
/// was already stored, or came earlier in `rows`).
pub(crate) async fn insert(
    conn: &mut sqlx::SqliteConnection,
    rows: &[RequestRecord],
) -> Result<Vec<bool>, sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle();
    // SQLite works synchronously: on a multi-threaded runtime the thread lets its other tasks
    // go to another worker while it does (a batch of thousands of rows takes milliseconds).
    let run = || {
        // SAFETY: `handle` keeps sqlx's worker thread from using the connection until it is
        // dropped, after this returns; the statements are finalized before that.
        unsafe { insert_locked(db, rows) }
    };
    let flavor = tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor());
    if matches!(flavor, Ok(tokio::runtime::RuntimeFlavor::MultiThread)) {
        tokio::task::block_in_place(run)
    } else {
        run()
    }
}

/// Rows per multi-row statement; 29 values a row, well under SQLite's 32,766 parameters.
/// `writer_bench 30000 sqlite timed 4096` under callgrind, the whole process: 812.7 million
/// instructions at 16 rows, 805.6 at 32, 820.5 at 64, 898.1 at 256 with a batch's last rows in
/// shorter statements, 796.2 at 32 with them one at a time (preparing a statement of 32 rows
/// takes ~0.9 million, once per batch).
const ROWS_PER_STATEMENT: usize = 32;

/// The insert statement's text for `rows` rows: every column, a parameter per value (`?`, each
/// numbered one more than the one before it); a row already stored is skipped.
fn statement(rows: usize) -> CString {
    let mut tuple = "?, ".repeat(VALUES);
    tuple.truncate(tuple.len() - 2);
    let mut sql = format!("INSERT INTO request_records ({COLUMNS}) VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        sql.push_str(&tuple);
        sql.push(')');
    }
    sql.push_str(" ON CONFLICT (request_id, attempt) DO NOTHING");
    // the text is ours and holds no NUL
    CString::new(sql).unwrap_or_default()
}

/// A prepared statement, finalized on drop.
struct Statement(NonNull<ffi::sqlite3_stmt>);

impl Drop for Statement {
    fn drop(&mut self) {
        // SAFETY: the statement was prepared on a connection that is still open and locked,
        // and is finalized once.
        unsafe {
            ffi::sqlite3_finalize(self.0.as_ptr());
        }
    }
}

/// The rows go in by multi-row statements, which say how many rows they inserted, not which
/// (`RETURNING` would say, at 5,700 more instructions a row: SQLite runs it as a trigger per
/// row; and single-row statements, whose counts would, cost 24,000 instructions a row inside
/// SQLite against 12,000: each opens five cursors and seeks them afresh). Nearly always every
/// row is new; when one was skipped (already stored, or given twice), the batch is undone to a
/// savepoint and inserted again one row at a time, each row's count saying whether it was new.
///
/// # Safety
/// `db` is an open connection, inside a transaction, that no other thread uses until this
/// returns.
unsafe fn insert_locked(
    db: NonNull<ffi::sqlite3>,
    rows: &[RequestRecord],
) -> Result<Vec<bool>, sqlx::Error> {
    let db = db.as_ptr();
    // SAFETY: the caller's contract, which `exec` and `run` ask for
    unsafe {
        exec(db, c"SAVEPOINT samewise_records")?;
        let mut prepared: Vec<(usize, Statement)> = Vec::new();
        let mut inserted = 0;
        let chunks = rows.chunks_exact(ROWS_PER_STATEMENT);
        // the few rows after the last whole chunk one at a time: cheaper than preparing
        // statements of their lengths
        let rest = chunks.remainder();
        for chunk in chunks.chain(rest.chunks(1)) {
            inserted += run(db, &mut prepared, chunk)?;
        }
        if inserted == rows.len() {
            exec(db, c"RELEASE samewise_records")?;
            return Ok(vec![true; rows.len()]);
        }
        exec(db, c"ROLLBACK TO samewise_records")?;
        let mut new = Vec::with_capacity(rows.len());
        for row in rows.chunks(1) {
            new.push(run(db, &mut prepared, row)? == 1);
        }
        exec(db, c"RELEASE samewise_records")?;
        Ok(new)
    }
}

/// Inserts `chunk` by one statement (of `prepared`, prepared when first needed for its
/// length); the number of rows inserted.
///
/// # Safety
/// `db` is an open connection that no other thread uses; `prepared` holds its statements.
unsafe fn run(
    db: *mut ffi::sqlite3,
    prepared: &mut Vec<(usize, Statement)>,
    chunk: &[RequestRecord],
) -> Result<usize, sqlx::Error> {
    let s = match prepared.iter().find(|(n, _)| *n == chunk.len()) {
        Some((_, st)) => st.0.as_ptr(),
        None => {
            // SAFETY: the caller's contract
            let st = unsafe { prepare(db, &statement(chunk.len())) }?;
            let s = st.0.as_ptr();
            prepared.push((chunk.len(), st));
            s
        }
    };
    // Texts are bound without a copy (SQLITE_STATIC): each lives in its record or in `texts`
    // until the statement is reset below. Every parameter is bound again for each chunk, so no
    // binding of an earlier chunk is read after its text is gone.
    let texts: Vec<[Option<Cow<'_, str>>; 8]> = chunk.iter().map(texts_of).collect();
    for (j, (r, t)) in chunk.iter().zip(&texts).enumerate() {
        for (i, v) in values(r, t).iter().enumerate() {
            // parameters are numbered from 1, VALUES a row
            let at = (j * VALUES + i + 1) as c_int;
            // SAFETY: `s` is a live statement of `db`; a text outlives the step (see above)
            if unsafe { bind(s, at, *v) } != ffi::SQLITE_OK {
                // SAFETY: the caller's contract
                return Err(unsafe { error(db) });
            }
        }
    }
    // SAFETY: as above
    let rc = unsafe { ffi::sqlite3_step(s) };
    // SAFETY: as above; the message and the count are read before the reset
    let done = unsafe {
        if rc == ffi::SQLITE_DONE {
            Ok(usize::try_from(ffi::sqlite3_changes(db)).unwrap_or(0))
        } else {
            Err(error(db))
        }
    };
    // SAFETY: as above
    unsafe { ffi::sqlite3_reset(s) };
    done
}

/// Runs one statement without parameters or rows (a savepoint's).
///
/// # Safety
/// `db` is an open connection that no other thread uses.
unsafe fn exec(db: *mut ffi::sqlite3, sql: &CStr) -> Result<(), sqlx::Error> {
    // SAFETY: the caller's contract; `sql` is NUL-terminated
    let rc = unsafe { ffi::sqlite3_exec(db, sql.as_ptr(), None, ptr::null_mut(), ptr::null_mut()) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        // SAFETY: as above
        Err(unsafe { error(db) })
    }
}

/// # Safety
/// `db` is an open connection that no other thread uses.
unsafe fn prepare(db: *mut ffi::sqlite3, sql: &CStr) -> Result<Statement, sqlx::Error> {
    let mut raw = ptr::null_mut();
    // SAFETY: the caller's contract; `sql` is NUL-terminated
    let rc = unsafe { ffi::sqlite3_prepare_v2(db, sql.as_ptr(), -1, &mut raw, ptr::null_mut()) };
    if rc != ffi::SQLITE_OK {
        // SAFETY: as above
        return Err(unsafe { error(db) });
    }
    NonNull::new(raw).map(Statement).ok_or_else(|| {
        sqlx::Error::Protocol("SQLite prepared no statement for the request records' insert".into())
    })
}

/// A record's texts as stored, in [`values`]' order.
fn texts_of(r: &RequestRecord) -> [Option<Cow<'_, str>>; 8] {
    [
        Some(text(&r.request_id)),
        Some(text(&r.model)),
        r.provider.as_deref().map(text),
        r.endpoint.as_deref().map(text),
        Some(text(&r.route)),
        r.error_kind.as_deref().map(text),
        r.finish_reason.as_deref().map(text),
        r.tool_finish_mismatch.as_deref().map(text),
    ]
}

/// A record's values in [`COLUMNS`] order, its texts as [`texts_of`] gave them.
fn values<'a>(r: &RequestRecord, t: &'a [Option<Cow<'_, str>>; 8]) -> [Value<'a>; VALUES] {
    let [
        request_id,
        model,
        provider,
        endpoint,
        route,
        error_kind,
        finish,
        tool_finish,
    ] = t.each_ref().map(|t| t.as_deref());
    [
        Value::Text(request_id),
        Value::Int(Some(i64::from(r.attempt))),
        Value::Int(Some(i64::from(r.final_attempt))),
        Value::Int(Some(r.ts_ms)),
        Value::Int(r.key_id),
        Value::Text(model),
        Value::Text(provider),
        Value::Text(endpoint),
        Value::Text(route),
        Value::Int(Some(i64::from(r.stream))),
        Value::Int(r.status.map(i64::from)),
        Value::Text(error_kind),
        Value::Int(Some(i64::from(r.attempts))),
        Value::Real(r.ttft_ms),
        Value::Real(Some(r.latency_ms)),
        Value::Real(r.tpot_ms),
        Value::Int(r.prompt_tokens),
        Value::Int(r.completion_tokens),
        Value::Int(Some(i64::from(r.usage_counted))),
        Value::Text(finish),
        Value::Int(Some(r.output_chars)),
        Value::Real(r.cost_usd),
        Value::Int(Some(i64::from(r.tool_calls))),
        Value::Int(Some(i64::from(r.tool_invalid_json))),
        Value::Int(Some(i64::from(r.tool_unknown_name))),
        Value::Int(Some(i64::from(r.tool_schema_mismatch))),
        Value::Text(tool_finish),
        Value::Int(Some(i64::from(r.tool_errored))),
        Value::Int(Some(i64::from(r.degenerate))),
    ]
}

/// Binds `v` to parameter `at` of `s`; SQLite's result code.
///
/// # Safety
/// `s` is a live statement on a connection no other thread uses; a text stays valid and
/// unmoved until `s` is reset or `at` bound again.
unsafe fn bind(s: *mut ffi::sqlite3_stmt, at: c_int, v: Value<'_>) -> c_int {
    // SAFETY: the caller's contract
    unsafe {
        match v {
            Value::Int(Some(n)) => ffi::sqlite3_bind_int64(s, at, n),
            Value::Real(Some(x)) => ffi::sqlite3_bind_double(s, at, x),
            Value::Text(Some(t)) => ffi::sqlite3_bind_text64(
                s,
                at,
                t.as_ptr().cast::<c_char>(),
                t.len() as u64,
                ffi::SQLITE_STATIC(),
                ffi::SQLITE_UTF8 as u8,
            ),
            Value::Int(None) | Value::Real(None) | Value::Text(None) => {
                ffi::sqlite3_bind_null(s, at)
            }
        }
    }
}

/// One bound value (None: SQL NULL).
#[derive(Clone, Copy)]
enum Value<'a> {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<&'a str>),
}

/// The connection's last error, as sqlx reports SQLite's.
///
/// # Safety
/// `db` is an open connection that no other thread uses.
unsafe fn error(db: *mut ffi::sqlite3) -> sqlx::Error {
    // SAFETY: the caller's contract; SQLite's message is NUL-terminated and copied here
    let (code, message) = unsafe {
        let msg = ffi::sqlite3_errmsg(db);
        let message = if msg.is_null() {
            String::new()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        };
        (ffi::sqlite3_extended_errcode(db), message)
    };
    sqlx::Error::Database(Box::new(SqliteCallError { code, message }))
}

/// An error of a direct SQLite call: its extended result code and message.
#[derive(Debug)]
struct SqliteCallError {
    code: c_int,
    message: String,
}

impl std::fmt::Display for SqliteCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "error returned from database: ({}) {}",
            self.code, self.message
        )
    }
}

impl std::error::Error for SqliteCallError {}

impl DatabaseError for SqliteCallError {
    fn message(&self) -> &str {
        &self.message
    }

    /// The extended result code, as sqlx's SQLite errors give it.
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        match self.code {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}
