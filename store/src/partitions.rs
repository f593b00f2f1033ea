//! Daily partitions of `request_records` on PostgreSQL. The table is range-partitioned on
//! `ts_ms`, one partition per UTC day named `request_records_pYYYYMMDD`, plus a default
//! partition for rows outside every day partition. [`Store::ensure_record_partitions`]
//! creates the days ahead (at connect and from the [`crate::RecordWriter`] once an hour);
//! [`Store::delete_request_records_before`] drops whole days before the cut-off and deletes
//! the remaining older rows. On SQLite there are no partitions and these calls only
//! delete rows.

use sqlx::{Acquire, Row};

use crate::connect::Pool;
use crate::{Store, StoreError};

/// Milliseconds in a UTC day.
pub const DAY_MS: i64 = 86_400_000;

/// Day partitions created ahead of today, so a proxy running over midnight never writes
/// into the default partition.
pub const DAYS_AHEAD: i64 = 2;

/// Key of the PostgreSQL advisory lock held while creating or dropping partitions
/// ("sw-parts" in ASCII).
pub const PARTITION_LOCK: i64 = 0x7377_2d70_6172_7473;

/// Name prefix of the day partitions.
const PREFIX: &str = "request_records_p";

impl Store {
    /// Creates the day partitions for the UTC days from the day of `from_ms` through
    /// `days_ahead` days after it (PostgreSQL; nothing on SQLite). Returns the names
    /// created now. A day whose rows already sit in the default partition cannot get its
    /// own partition: it is skipped with a WARN, and its rows stay in the default one.
    pub async fn ensure_record_partitions(
        &self,
        from_ms: i64,
        days_ahead: i64,
    ) -> Result<Vec<String>, StoreError> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(Vec::new());
        };
        const OP: &str = "creating request-record partitions";
        let first = from_ms.div_euclid(DAY_MS);
        let wanted: Vec<(i64, String)> = (first..=first.saturating_add(days_ahead.max(0)))
            .map(|day| (day, partition_name(day)))
            .collect();
        let existing = self.record_partitions().await?;
        if wanted.iter().all(|(_, name)| existing.contains(name)) {
            return Ok(Vec::new()); // the common case: nothing to do, no lock taken
        }
        // Serialise with other processes doing the same (or dropping partitions).
        let mut tx = pool.begin().await.map_err(StoreError::query(OP))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PARTITION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?;
        let existing = list_partitions(&mut tx).await?;
        let mut created = Vec::new();
        for (day, name) in wanted {
            if existing.contains(&name) {
                continue;
            }
            let sql = format!(
                "CREATE TABLE {name} PARTITION OF request_records FOR VALUES FROM ({}) TO ({})",
                day * DAY_MS,
                (day + 1) * DAY_MS
            );
            // a savepoint, so that one refused day does not abort the others
            let mut sp = tx.begin().await.map_err(StoreError::query(OP))?;
            match sqlx::query(&sql).execute(&mut *sp).await {
                Ok(_) => {
                    sp.commit().await.map_err(StoreError::query(OP))?;
                    created.push(name);
                }
                // rows of this day already sit in the default partition
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23514") => {
                    sp.rollback().await.map_err(StoreError::query(OP))?;
                    tracing::warn!(partition = %name, error = %e, "day partition not created; its rows stay in the default partition");
                }
                Err(source) => return Err(StoreError::Query { op: OP, source }),
            }
        }
        tx.commit().await.map_err(StoreError::query(OP))?;
        Ok(created)
    }

    /// The names of the day partitions that exist, oldest first (empty on SQLite).
    pub async fn record_partitions(&self) -> Result<Vec<String>, StoreError> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(Vec::new());
        };
        let mut conn = pool
            .acquire()
            .await
            .map_err(StoreError::query("listing request-record partitions"))?;
        list_partitions(&mut conn).await
    }

    /// Deletes records older than `ts_ms` (retention); returns how many were deleted. On
    /// PostgreSQL, day partitions that end at or before `ts_ms` are dropped whole (under the
    /// partition lock, so gateways sharing the database may run this at the same time).
    pub async fn delete_request_records_before(&self, ts_ms: i64) -> Result<u64, StoreError> {
        const OP: &str = "deleting old request records";
        match &self.pool {
            Pool::Postgres(pool) => {
                let mut deleted = 0u64;
                for name in self.record_partitions().await? {
                    let Some(day) = parse_partition_day(&name) else {
                        continue;
                    };
                    if (day + 1) * DAY_MS > ts_ms {
                        continue;
                    }
                    let mut tx = pool.begin().await.map_err(StoreError::query(OP))?;
                    sqlx::query("SELECT pg_advisory_xact_lock($1)")
                        .bind(PARTITION_LOCK)
                        .execute(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?;
                    // another gateway's pass may have dropped it since the listing
                    if !list_partitions(&mut tx).await?.contains(&name) {
                        continue;
                    }
                    let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {name}"))
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?;
                    sqlx::query(&format!("DROP TABLE {name}"))
                        .execute(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?;
                    tx.commit().await.map_err(StoreError::query(OP))?;
                    deleted += u64::try_from(count).unwrap_or(0);
                    tracing::info!(partition = %name, rows = count, "dropped request-record partition (retention)");
                }
                let rest = sqlx::query("DELETE FROM request_records WHERE ts_ms < $1")
                    .bind(ts_ms)
                    .execute(pool)
                    .await
                    .map_err(StoreError::query(OP))?
                    .rows_affected();
                Ok(deleted + rest)
            }
            Pool::Sqlite(pool) => Ok(sqlx::query("DELETE FROM request_records WHERE ts_ms < ?")
                .bind(ts_ms)
                .execute(pool)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()),
        }
    }
}

/// The day partitions of `request_records`, by name, oldest first.
async fn list_partitions(conn: &mut sqlx::PgConnection) -> Result<Vec<String>, StoreError> {
    const OP: &str = "listing request-record partitions";
    let rows = sqlx::query(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'request_records'::regclass ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .map_err(StoreError::query(OP))?;
    let mut names = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.try_get(0).map_err(StoreError::query(OP))?;
        if parse_partition_day(&name).is_some() {
            names.push(name);
        }
    }
    Ok(names)
}

/// `request_records_pYYYYMMDD` for the UTC day `day` (days since 1970-01-01).
pub fn partition_name(day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    format!("{PREFIX}{y:04}{m:02}{d:02}")
}

/// The day number of a partition name made by [`partition_name`].
pub fn parse_partition_day(name: &str) -> Option<i64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let y: i64 = digits[..4].parse().ok()?;
    let m: u32 = digits[4..6].parse().ok()?;
    let d: u32 = digits[6..].parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let day = days_from_civil(y, m, d);
    (civil_from_days(day) == (y, m, d)).then_some(day)
}

/// Gregorian (year, month, day) of a day count since 1970-01-01 (H. Hinnant's algorithm).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m as u32, d as u32)
}

/// Day count since 1970-01-01 of a Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_days() {
        assert_eq!(partition_name(0), "request_records_p19700101");
        assert_eq!(partition_name(20_787), "request_records_p20261130");
        assert_eq!(partition_name(11_017), "request_records_p20000301");
        assert_eq!(partition_name(11_016), "request_records_p20000229");
        assert_eq!(partition_name(-1), "request_records_p19691231");
        for day in -800..30_000 {
            assert_eq!(
                parse_partition_day(&partition_name(day)),
                Some(day),
                "day {day}"
            );
        }
        assert_eq!(parse_partition_day("request_records_p20230229"), None);
        assert_eq!(parse_partition_day("request_records_default"), None);
        assert_eq!(parse_partition_day("request_records_p2026113"), None);
    }
}
