//! The streaming response body: upstream SSE bytes go to the client event by event as they
//! arrive, never buffered whole, while the [`Inspector`] reads each event on the side.
//!
//! The bytes are cut into whole event blocks by [`EventFramer`] and each block is forwarded as
//! the upstream sent it (comments and keep-alives included) as soon as its blank line arrives;
//! working per block lets the relay drop the usage-only chunk the client did not ask for and
//! cut a degenerate generation at an event boundary without re-encoding anything.
//!
//! Whatever ends the stream — `[DONE]`, the upstream closing early, a reset, an idle timeout,
//! broken SSE, the degeneration guard, or the client going away (the body is dropped) — the
//! attempt is recorded exactly once. A failure after the first byte ends the stream with an
//! OpenAI-style error event, `data: {"error": {...}}`.

use std::convert::Infallible;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use samewise_store::ErrorKind;
use samewise_wire::ErrorBody;
use samewise_wire::sse::{SseDecoder, SseEvent, encode_data};
use tokio::time::Instant;

use crate::frames::EventFramer;
use crate::health::{Admission, InflightGuard};
use crate::inspect::{EventAction, Inspector};
use crate::record::{self, AttemptCtx, RequestCtx};
use crate::state::AppState;

/// One streaming attempt whose answer is going to the client.
pub(crate) struct Relay {
    pub(crate) state: AppState,
    pub(crate) ctx: RequestCtx,
    pub(crate) att: AttemptCtx,
    pub(crate) status: u16,
    pub(crate) upstream: BoxStream<'static, Result<Bytes, hyper::Error>>,
    pub(crate) idle: IdleTimer,
    pub(crate) framer: EventFramer,
    pub(crate) decoder: SseDecoder,
    /// The blocks of one read (kept between reads: no allocation per event).
    pub(crate) blocks: Vec<Bytes>,
    /// The decoded events of one block (kept likewise).
    pub(crate) events: Vec<SseEvent>,
    pub(crate) inspector: Option<Inspector>,
    pub(crate) _inflight: InflightGuard,
}

impl Relay {
    /// The response body.
    pub(crate) fn into_body(self) -> axum::body::Body {
        let stream = futures_util::stream::unfold(self, |mut relay| async move {
            relay
                .next_chunk()
                .await
                .map(|b| (Ok::<Bytes, Infallible>(b), relay))
        });
        axum::body::Body::from_stream(stream)
    }

    /// The next bytes for the client, or None when the stream is over: what the upstream sends
    /// next, waited for (up to the idle timeout), and with it whatever else it has ready by the
    /// time this thread's other scheduled tasks have run [`READY_ROUNDS`] times (up to
    /// [`COALESCE_BYTES`]).
    ///
    /// The upstream connection is a task of its own that hands its body over one chunk at a
    /// time: without the second part each SSE event would go to the client in a write of its
    /// own even when a burst of them arrived in one read (a provider flushing several tokens at
    /// once, or a relay that fell behind). Taking what is ready costs [`READY_ROUNDS`] more
    /// polls per read when nothing more came; it never waits for bytes that have not arrived.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let first = self.read(true).await?;
        let mut more: Option<BytesMut> = None;
        while self.inspector.is_some()
            && more.as_ref().map_or(first.len(), BytesMut::len) < COALESCE_BYTES
        {
            let Some(next) = self.read(false).await else {
                break;
            };
            more.get_or_insert_with(|| BytesMut::from(&first[..]))
                .extend_from_slice(&next);
        }
        Some(more.map_or(first, BytesMut::freeze))
    }

    /// The next bytes for the client from what the upstream sends; None when the stream is over
    /// or, unless `wait`, when the upstream has nothing ready (see [`ready_soon`]).
    async fn read(&mut self, wait: bool) -> Option<Bytes> {
        loop {
            self.inspector.as_ref()?;
            let item = if wait {
                tokio::select! {
                    biased;
                    item = self.upstream.next() => item,
                    () = self.idle.expired() => {
                        return Some(
                            self.fail(ErrorKind::StreamIdleTimeout, "the upstream stopped sending"),
                        );
                    }
                }
            } else {
                ready_soon(&mut self.upstream).await?
            };
            let now = Instant::now();
            self.idle.last = now;
            match item {
                Some(Err(_)) => {
                    return Some(self.fail(
                        ErrorKind::StreamReset,
                        "the upstream connection broke mid-stream",
                    ));
                }
                None => return self.at_end(),
                Some(Ok(bytes)) => {
                    let mut blocks = std::mem::take(&mut self.blocks);
                    let out = match self.framer.push(bytes, &mut blocks) {
                        Ok(()) => self.pass(blocks.drain(..), now),
                        Err(_) => Some(self.fail(
                            ErrorKind::BrokenSse,
                            "the upstream sent an event larger than allowed",
                        )),
                    };
                    blocks.clear();
                    self.blocks = blocks;
                    if out.is_some() {
                        return out;
                    }
                }
            }
        }
    }

    /// Reads whole event blocks on the side and returns the bytes to forward (each block as
    /// the upstream sent it; one block alone is sent as it is, without a copy); None when
    /// nothing is to be sent.
    fn pass(&mut self, blocks: impl Iterator<Item = Bytes>, now: Instant) -> Option<Bytes> {
        let mut out = Gather::default();
        let mut events = std::mem::take(&mut self.events);
        for block in blocks {
            for ev in events.drain(..) {
                self.decoder.recycle(ev);
            }
            if self.decoder.feed_into(&block, &mut events).is_err() {
                out.push(self.fail(
                    ErrorKind::BrokenSse,
                    "the upstream sent an invalid event stream",
                ));
                break;
            }
            let Some(inspector) = self.inspector.as_mut() else {
                break;
            };
            // A block holds at most one event (or none: a comment or keep-alive).
            let mut action = EventAction::Forward;
            let mut done = false;
            for ev in &events {
                done |= ev.is_done();
                match inspector.on_event(&ev.data, now) {
                    EventAction::Cut => action = EventAction::Cut,
                    EventAction::Drop if action == EventAction::Forward => {
                        action = EventAction::Drop
                    }
                    _ => {}
                }
            }
            match action {
                EventAction::Forward => out.push(block),
                EventAction::Drop => {}
                EventAction::Cut => {
                    out.push(error_event(
                        ErrorKind::Degenerate.as_str(),
                        "generation stopped: the same output repeated too many times in a row",
                    ));
                    self.finalize(Some(ErrorKind::Degenerate), false);
                    break;
                }
            }
            if done {
                // Nothing after [DONE] matters; end here.
                self.finalize(None, true);
                break;
            }
        }
        for ev in events.drain(..) {
            self.decoder.recycle(ev);
        }
        self.events = events;
        out.finish()
    }

    /// The upstream body ended.
    fn at_end(&mut self) -> Option<Bytes> {
        if self.framer.has_partial() {
            // Half an event is never forwarded: the client's parser would glue it to ours.
            return Some(self.fail(
                ErrorKind::StreamTruncated,
                "the upstream ended the stream in the middle of an event",
            ));
        }
        if self.inspector.as_ref().is_some_and(Inspector::saw_finish) {
            // Finished but without [DONE]: complete enough; record it and end cleanly.
            self.finalize(Some(ErrorKind::MissingDone), true);
            return None;
        }
        Some(self.fail(
            ErrorKind::StreamTruncated,
            "the upstream ended the stream before it finished",
        ))
    }

    /// Ends the stream with an error event and records the failure.
    fn fail(&mut self, kind: ErrorKind, message: &str) -> Bytes {
        self.finalize(Some(kind), false);
        error_event(kind.as_str(), message)
    }

    /// Records the attempt once; `healthy` is the breaker outcome.
    fn finalize(&mut self, error_kind: Option<ErrorKind>, healthy: bool) {
        let Some(inspector) = self.inspector.take() else {
            return;
        };
        let obs = inspector.finish();
        self.ctx.answer.clone_from(&obs.answer);
        let kind = match error_kind {
            Some(k) => Some(k),
            None if obs.upstream_error => Some(ErrorKind::UpstreamStreamError),
            None if obs.invalid_events > 0 => Some(ErrorKind::InvalidJson),
            None => None,
        };
        if !healthy {
            self.att.endpoint.health.record(Admission::Normal, false);
        }
        let record = self.ctx.attempt_record(
            &self.att,
            Some(self.status),
            kind,
            Some(&obs),
            Instant::now(),
        );
        record::finish(&self.state, &mut self.ctx, record);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The client went away before the stream ended (or the server is shutting down).
        if self.inspector.is_some() {
            self.finalize(Some(ErrorKind::ClientDisconnect), true);
        }
    }
}

/// A stream's idle timeout: the upstream sent nothing for `idle`. One timer serves the whole
/// stream, armed at the last arrival plus `idle` and moved on only when it fires before that (an
/// item came since), instead of a timer armed and cancelled for every read.
pub(crate) struct IdleTimer {
    idle: Duration,
    /// When the upstream's last item arrived (or the stream began).
    last: Instant,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl IdleTimer {
    /// Starts counting now.
    pub(crate) fn new(idle: Duration) -> Self {
        let last = Instant::now();
        IdleTimer {
            idle,
            last,
            timer: Box::pin(tokio::time::sleep_until(due(last, idle))),
        }
    }

    /// Resolves once nothing has arrived for `idle` (cancel-safe: its state is `self`'s).
    async fn expired(&mut self) {
        loop {
            self.timer.as_mut().await;
            let due = due(self.last, self.idle);
            if Instant::now() >= due {
                return;
            }
            self.timer.as_mut().reset(due);
        }
    }
}

/// `at + after`, or a day past now where that overflows `Instant` (never, in effect).
fn due(at: Instant, after: Duration) -> Instant {
    at.checked_add(after)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400))
}

/// The bytes one read sends on: a single block as it came (a slice of the upstream's read),
/// several copied into one buffer.
#[derive(Default)]
struct Gather {
    one: Option<Bytes>,
    many: Option<BytesMut>,
}

impl Gather {
    fn push(&mut self, bytes: Bytes) {
        if let Some(many) = self.many.as_mut() {
            many.extend_from_slice(&bytes);
        } else if let Some(first) = self.one.take() {
            let mut many = BytesMut::with_capacity(first.len() + bytes.len());
            many.extend_from_slice(&first);
            many.extend_from_slice(&bytes);
            self.many = Some(many);
        } else {
            self.one = Some(bytes);
        }
    }

    fn finish(self) -> Option<Bytes> {
        match self.many {
            Some(many) => Some(many.freeze()),
            None => self.one.filter(|b| !b.is_empty()),
        }
    }
}

/// What one write to the client gathers at most from a burst the upstream has ready.
const COALESCE_BYTES: usize = 64 * 1024;

/// How many times [`ready_soon`] lets the thread's other tasks run before it gives up: the
/// upstream connection's task has decoded its next buffered chunk after two (hyper 1.12's
/// client on tokio 1.54's current-thread scheduler, measured), and a third would only cost
/// another poll at the end of every burst.
const READY_ROUNDS: u32 = 2;

/// The stream's next item if it is ready now, or once the tasks already scheduled on this
/// thread have run [`READY_ROUNDS`] times (this task wakes itself and goes to the back of the
/// queue each time): Some(item), or None when nothing came meanwhile. The upstream
/// connection's task, woken when the last chunk was taken, decodes its next chunk from what it
/// has already read in that time; nothing here waits for the network.
fn ready_soon<S: Stream + Unpin>(
    stream: &mut S,
) -> impl Future<Output = Option<Option<S::Item>>> + '_ {
    let mut rounds = 0;
    std::future::poll_fn(move |cx| match stream.poll_next_unpin(cx) {
        Poll::Ready(item) => Poll::Ready(Some(item)),
        Poll::Pending if rounds < READY_ROUNDS => {
            rounds += 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        Poll::Pending => Poll::Ready(None),
    })
}

/// The OpenAI-style error event that ends a failed stream.
pub(crate) fn error_event(code: &str, message: &str) -> Bytes {
    let body = ErrorBody::new(message, "server_error", Some(code));
    Bytes::from(encode_data(&body.to_json()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_idle_timer_counts_from_the_last_arrival() {
        let idle = Duration::from_millis(100);
        let mut t = IdleTimer::new(idle);
        let start = Instant::now();
        // an arrival every 60 ms keeps it from expiring, though its first deadline passes
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            let fired = tokio::time::timeout(Duration::ZERO, t.expired())
                .await
                .is_ok();
            assert!(!fired, "expired at {:?}", Instant::now() - start);
            t.last = Instant::now();
        }
        t.expired().await;
        assert_eq!(Instant::now() - start, Duration::from_millis(5 * 60 + 100));
    }
}
