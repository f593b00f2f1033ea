//! The bound on concurrent streams per samewise key (`limits.max_streams_per_key`): a
//! streamed request takes a [`StreamPermit`] before any upstream attempt and the permit rides
//! in the response body, so it is released when the stream ends, breaks or its client goes —
//! by ownership, whatever the path. A key at its bound gets an OpenAI-shaped 429
//! (`too_many_streams`, with `Retry-After`); its other requests are not affected. The count is
//! per gateway process.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;

use crate::error::ApiError;

/// Streams open per key id.
#[derive(Debug, Default)]
pub(crate) struct OpenStreams {
    open: Mutex<HashMap<i64, u32>>,
}

/// One open stream of a key; dropping it closes the stream's slot.
#[derive(Debug)]
pub(crate) struct StreamPermit {
    streams: Arc<OpenStreams>,
    key_id: i64,
}

impl OpenStreams {
    /// Takes a slot for `key_id`, or a 429 when it has `limit` streams open already.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        key_id: i64,
        limit: u32,
    ) -> Result<StreamPermit, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key_id).or_insert(0);
        if *n >= limit {
            return Err(ApiError::TooManyStreams { limit });
        }
        *n += 1;
        Ok(StreamPermit {
            streams: Arc::clone(self),
            key_id,
        })
    }

    /// Streams `key_id` has open now.
    #[cfg(test)]
    fn open(&self, key_id: i64) -> u32 {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&key_id).copied().unwrap_or(0)
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key_id);
            }
        }
    }
}

/// `resp` with `permit` held by its body until the body is finished or dropped.
pub(crate) fn hold(resp: Response, permit: StreamPermit) -> Response {
    resp.map(|inner| {
        Body::new(HeldBody {
            inner,
            _permit: permit,
        })
    })
}

/// A response body that holds its stream's permit.
struct HeldBody {
    inner: Body,
    /// Released with the body.
    _permit: StreamPermit,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_its_limit_and_a_dropped_body_frees_its_slot() {
        let streams = Arc::new(OpenStreams::default());
        let a = streams.acquire(1, 2).unwrap();
        let b = streams.acquire(1, 2).unwrap();
        let refused = streams.acquire(1, 2).err().unwrap();
        assert_eq!(refused, ApiError::TooManyStreams { limit: 2 });
        assert_eq!(refused.code(), "too_many_streams");
        // another key is not affected
        assert!(streams.acquire(2, 2).is_ok());
        drop(a);
        let resp = hold(
            Response::new(Body::from("x")),
            streams.acquire(1, 2).unwrap(),
        );
        assert_eq!(streams.open(1), 2);
        drop(resp);
        drop(b);
        assert_eq!(streams.open(1), 0);
    }
}
