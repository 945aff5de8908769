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

    /// A 500 with a message: a fault of the server, never of the client.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
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
            ServeError::InvalidRequest(_) | ServeError::LoadFailed { .. } => StatusCode::BAD_REQUEST,
            // Triton: UNAVAILABLE (its clients' tests match the status).
            ServeError::NotAllowed(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServeError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            // Triton: UNSUPPORTED, answered 501 (gRPC UNIMPLEMENTED).
            ServeError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            ServeError::Backend(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error()
            && status != StatusCode::SERVICE_UNAVAILABLE
            && status != StatusCode::NOT_IMPLEMENTED
        {
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

/// A request's sequence parameters that make no sequence: the client's error.
impl From<trident_serve::sequence::FlagsError> for ApiError {
    fn from(e: trident_serve::sequence::FlagsError) -> Self {
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

/// The same errors on gRPC: the HTTP status chooses the gRPC code (one mapping for
/// both front ends), the message is the same text.
impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let code = match e.status {
            StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => tonic::Code::InvalidArgument,
            StatusCode::NOT_FOUND => tonic::Code::NotFound,
            StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::PAYLOAD_TOO_LARGE => tonic::Code::ResourceExhausted,
            StatusCode::NOT_IMPLEMENTED => tonic::Code::Unimplemented,
            StatusCode::CONFLICT => tonic::Code::AlreadyExists,
            StatusCode::REQUEST_TIMEOUT => tonic::Code::DeadlineExceeded,
            s if s.is_client_error() => tonic::Code::InvalidArgument,
            _ => tonic::Code::Internal,
        };
        tonic::Status::new(code, e.message)
    }
}
