//! axum's own refusals in the API's error shape: a query string or a path parameter that does not
//! read, an unknown route, a method the route does not take. Every error of the API is then
//! `{"error": "..."}` with its status, whichever layer refused. (Bodies are read as bytes and parsed
//! by the handlers, whose errors are the API's already.)

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, Uri};
use serde::de::DeserializeOwned;

use super::ApiError;

/// axum's `Query`, refused as the API's JSON 400 naming the parameter (`?limit=abc`).
#[derive(Debug)]
pub(super) struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(ApiError(rejection.status(), rejection.body_text())),
        }
    }
}

/// axum's `Path`, refused as the API's JSON error (a parameter that is not UTF-8 once decoded).
#[derive(Debug)]
pub(super) struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError(rejection.status(), rejection.body_text())),
        }
    }
}

/// The router's fallback: no route has this path.
pub(super) async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no route for {method} {}", uri.path()))
}

/// The routes' fallback for a method they do not take (axum adds the `Allow` header).
pub(super) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError(StatusCode::METHOD_NOT_ALLOWED, format!("{} does not take {method}", uri.path()))
}
