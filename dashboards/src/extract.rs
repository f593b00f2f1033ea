//! The query-string, path and form extractors of the dashboards: axum's, with their rejections
//! turned into [`DashError::Rejected`] (axum's status and message) — an OpenAI-shaped JSON error
//! from the API, the error page from the pages — instead of axum's plain-text bodies ("Failed
//! to deserialize query string: missing field `endpoint`").

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::DashError;

/// `axum::extract::Query` whose rejection is a [`DashError`].
pub struct Query<T>(pub T);

/// `axum::extract::Path` whose rejection is a [`DashError`].
pub struct Path<T>(pub T);

/// `axum::Form` whose rejection is a [`DashError`].
pub struct Form<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = DashError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, DashError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(DashError::Rejected(e.status(), e.body_text())),
        }
    }
}

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = DashError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, DashError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(DashError::Rejected(e.status(), e.body_text())),
        }
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Form<T> {
    type Rejection = DashError;

    async fn from_request(req: Request, state: &S) -> Result<Self, DashError> {
        match axum::Form::<T>::from_request(req, state).await {
            Ok(axum::Form(v)) => Ok(Form(v)),
            Err(e) => Err(DashError::Rejected(e.status(), e.body_text())),
        }
    }
}
