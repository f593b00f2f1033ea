//! Hedged attempts (a model's `hedge_after_ms`): when an attempt has no response head after the
//! delay, a second attempt goes to another endpoint of the plan (the next one that is not
//! waiting out a `Retry-After` and whose breaker admits it), and the first usable head wins.
//! The loser's future is dropped, which drops its connection, and it is recorded with
//! `hedge_lost`. A primary beaten by its hedge counts as a breaker failure (it had no head
//! within the delay while another endpoint answered), so a hung endpoint is ejected under
//! hedging too; a beaten hedge's permit goes back without an outcome. A hedge that fails leaves the other attempt to go on
//! alone. Bounds: at most one hedge per request (the caller asks once), none when no other
//! endpoint can take it.

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use samewise_store::{ErrorKind, RequestRecord};
use tokio::time::Instant;

use crate::body::ClientRequest;
use crate::head::{self, Head, NoHead};
use crate::health::Permit;
use crate::record::{AttemptCtx, RequestCtx};
use crate::routing::{self, Endpoint};
use crate::state::AppState;

/// What waiting for a head, hedged or not, came to.
pub(crate) struct Raced {
    /// The winning head with its attempt and plan index, or the last failure.
    pub(crate) result: Result<(Head, AttemptCtx, usize), NoHead>,
    /// Records of the other attempt when there was a hedge (failed, or lost), not yet sent.
    pub(crate) side: Vec<RequestRecord>,
    /// The plan index of the hedge, when one was sent.
    pub(crate) hedged: Option<usize>,
}

/// Waits for a head from `first` (plan index, attempt, permit); with `after` set, hedges once
/// on another endpoint of `plan` (never `skip`) after that long.
pub(crate) async fn first_head(
    state: &AppState,
    req: &ClientRequest,
    ctx: &RequestCtx,
    plan: &[Arc<Endpoint>],
    first: (usize, AttemptCtx, Permit),
    after: Option<Duration>,
    skip: Option<usize>,
) -> Raced {
    let (i, att, permit) = first;
    let mut slot1 = Some(permit);
    let mut slot2: Option<Permit>;
    let single = |r: Result<Head, NoHead>, att: &AttemptCtx| Raced {
        result: r.map(|h| (h, att.clone(), i)),
        side: Vec::new(),
        hedged: None,
    };
    let (result, side, j) = {
        let mut primary = pin!(head::send(state, req, ctx, plan, &att, &mut slot1));
        let Some(after) = after.filter(|_| plan.len() > 1) else {
            return single(primary.await, &att);
        };
        tokio::select! {
            r = &mut primary => return single(r, &att),
            () = tokio::time::sleep(after) => {}
        }
        let skip: Vec<usize> = std::iter::once(i).chain(skip).collect();
        let Some((j, permit2)) = routing::next_admitted(plan, i + 1, &skip) else {
            return single(primary.await, &att);
        };
        slot2 = Some(permit2);
        let att2 = AttemptCtx::new(att.attempt + 1, Arc::clone(&plan[j]));
        let mut hedge = pin!(head::send(state, req, ctx, plan, &att2, &mut slot2));
        let mut side = Vec::new();
        let result = tokio::select! {
            r = &mut primary => settle(ctx, r, (&att, i), hedge.as_mut(), (&att2, j), &mut side).await,
            r = &mut hedge => settle(ctx, r, (&att2, j), primary.as_mut(), (&att, i), &mut side).await,
        };
        (result, side, j)
    };
    // Both futures are gone. A primary beaten by its hedge had no head within the delay while
    // another endpoint answered: that counts against it (else a hung endpoint would never be
    // ejected under hedging, every hedge winning before it is overdue). A beaten hedge's
    // permit goes back without an outcome.
    if matches!(&result, Ok((_, _, w)) if *w == j)
        && let Some(p) = slot1.take()
    {
        p.record(false);
    }
    drop(slot2);
    Raced {
        result,
        side,
        hedged: Some(j),
    }
}

/// One of two racing attempts (`done`) finished: a head wins and the other is cancelled and
/// recorded as lost; a failure is recorded and the other goes on alone.
async fn settle<F>(
    ctx: &RequestCtx,
    done: Result<Head, NoHead>,
    (done_att, done_i): (&AttemptCtx, usize),
    other: Pin<&mut F>,
    (other_att, other_i): (&AttemptCtx, usize),
    side: &mut Vec<RequestRecord>,
) -> Result<(Head, AttemptCtx, usize), NoHead>
where
    F: Future<Output = Result<Head, NoHead>>,
{
    match done {
        Ok(h) => {
            // The loser's future is dropped by the caller when this returns: its connection
            // closes and its permit goes back unrecorded.
            side.push(ctx.attempt_record(
                other_att,
                None,
                Some(ErrorKind::HedgeLost),
                None,
                Instant::now(),
            ));
            Ok((h, done_att.clone(), done_i))
        }
        Err(NoHead::Failed { record, .. }) => {
            side.push(*record);
            other.await.map(|h| (h, other_att.clone(), other_i))
        }
        Err(refused @ NoHead::Refused(_)) => Err(refused),
    }
}
