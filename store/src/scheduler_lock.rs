//! One active probe scheduler per database. On PostgreSQL the scheduler holds a session
//! advisory lock on a dedicated connection (outside the pool) for as long as its
//! [`SchedulerLock`] lives: several `samewise serve` processes can share one database and
//! exactly one of them probes. The lock goes with the session, so a crashed holder's lock is
//! freed by the server. On SQLite (one process per file) the lock is always granted.

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::connect::Pool;
use crate::{Store, StoreError};

/// Key of the PostgreSQL advisory lock of the probe scheduler ("sw-probe" in ASCII).
pub const PG_SCHEDULER_LOCK: i64 = 0x7377_2d70_726f_6265;

/// Proof that this process is the database's probe scheduler, until dropped or
/// [`released`](SchedulerLock::release).
#[derive(Debug)]
pub struct SchedulerLock {
    /// The PostgreSQL session holding the advisory lock; None on SQLite.
    conn: Option<PgConnection>,
}

impl SchedulerLock {
    /// Checks that the lock is still held: on PostgreSQL, that its session is alive (a
    /// session that died took the lock with it, and another process may now hold it).
    pub async fn check(&mut self) -> Result<(), StoreError> {
        match self.conn.as_mut() {
            Some(conn) => conn
                .ping()
                .await
                .map_err(StoreError::query("checking the scheduler lock's session")),
            None => Ok(()),
        }
    }

    /// Gives the lock up now, waiting for the server to confirm. (Dropping the guard gives
    /// it up too, by closing its session.)
    pub async fn release(mut self) -> Result<(), StoreError> {
        if let Some(mut conn) = self.conn.take() {
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(PG_SCHEDULER_LOCK)
                .execute(&mut conn)
                .await
                .map_err(StoreError::query("releasing the scheduler lock"))?;
            conn.close()
                .await
                .map_err(StoreError::query("closing the scheduler lock's session"))?;
        }
        Ok(())
    }
}

impl Store {
    /// Takes the database's probe-scheduler lock if no other process holds it: Some(guard)
    /// when this process is now the scheduler, None when another one is. On SQLite always
    /// Some.
    pub async fn try_scheduler_lock(&self) -> Result<Option<SchedulerLock>, StoreError> {
        match &self.pool {
            Pool::Sqlite(_) => Ok(Some(SchedulerLock { conn: None })),
            Pool::Postgres(pool) => {
                let options = pool.connect_options();
                let mut conn = PgConnection::connect_with(&options)
                    .await
                    .map_err(StoreError::query("opening the scheduler lock's session"))?;
                let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(PG_SCHEDULER_LOCK)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(StoreError::query("taking the scheduler lock"))?;
                if got {
                    Ok(Some(SchedulerLock { conn: Some(conn) }))
                } else {
                    let _ = conn.close().await;
                    Ok(None)
                }
            }
        }
    }
}
