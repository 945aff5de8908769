//! The one place where errors become HTTP statuses and `{"error": "..."}` bodies.

use crate::codec::CodecError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use trident_serve::ServeError;

/// An error on its way to an HTTP client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// The same message with another status.
    pub fn with_status(self, status: StatusCode) -> Self {
        ApiError { status, ..self }
    }

    /// An error with a status and a message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// A 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl From<ServeError> for ApiError {
    fn from(e: ServeError) -> Self {
        let status = match &e {
            ServeError::ModelNotFound(_) | ServeError::VersionNotFound { .. } => StatusCode::NOT_FOUND,
            ServeError::NotReady { .. } | ServeError::Unloading(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServeError::InvalidRequest(_) | ServeError::NotAllowed(_) => StatusCode::BAD_REQUEST,
            ServeError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ServeError::Backend(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!("{e}");
        }
        ApiError {
            status,
            message: e.to_string(),
        }
    }
}

impl From<CodecError> for ApiError {
    fn from(e: CodecError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}
