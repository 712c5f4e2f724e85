//! Domain errors of the API and the one place they become gRPC status codes.
//!
//! Every message is written for the person at the other end: it says what was wrong and,
//! where there is one, what to do about it.

use tonic::{Code, Status};

/// The writer thread has stopped (shutdown or fatal error).
#[derive(Debug, thiserror::Error)]
#[error("the database writer has stopped")]
pub struct WriterGone;

/// An error a request can end with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A request field is wrong; `field` names it as the `.proto` does.
    #[error("{field}: {msg}")]
    InvalidArgument { field: &'static str, msg: String },
    /// An id that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the current state forbids it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit was hit (disk full, too many sessions, ...).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The caller's uid and groups do not allow it.
    #[error("{0}")]
    PermissionDenied(String),
    /// The caller did not prove who it is (a TCP call without a valid token or certificate).
    #[error("{0}")]
    Unauthenticated(String),
    /// The daemon is shutting down or a part of it is not running.
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected storage failure.
    #[error("{0}")]
    Internal(String),
}

/// Shorthand for results of domain operations.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn invalid(field: &'static str, msg: impl Into<String>) -> ApiError {
        ApiError::InvalidArgument { field, msg: msg.into() }
    }

    /// The gRPC code of this error.
    pub fn code(&self) -> Code {
        match self {
            ApiError::InvalidArgument { .. } => Code::InvalidArgument,
            ApiError::NotFound(_) => Code::NotFound,
            ApiError::FailedPrecondition(_) => Code::FailedPrecondition,
            ApiError::ResourceExhausted(_) => Code::ResourceExhausted,
            ApiError::PermissionDenied(_) => Code::PermissionDenied,
            ApiError::Unauthenticated(_) => Code::Unauthenticated,
            ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::Internal(_) => Code::Internal,
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        if matches!(e, ApiError::Internal(_)) {
            tracing::error!(error = %e, "request failed");
        }
        Status::new(e.code(), e.to_string())
    }
}

impl From<WriterGone> for ApiError {
    fn from(_: WriterGone) -> ApiError {
        ApiError::Unavailable("gpuprofd is shutting down; retry once it is back".into())
    }
}

impl From<rusqlite::Error> for ApiError {
    fn from(e: rusqlite::Error) -> ApiError {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => {
                ApiError::ResourceExhausted(format!("the database disk is full ({e}); free space or lower retention"))
            }
            Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked) => {
                ApiError::Unavailable(format!("the database is busy ({e}); retry"))
            }
            _ => ApiError::Internal(format!("database error: {e}")),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        // Keep the mapping of a full disk.
        if let Some(s) = e.downcast_ref::<rusqlite::Error>()
            && s.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
        {
            return ApiError::ResourceExhausted(format!("{e:#}; free space or lower retention"));
        }
        ApiError::Internal(format!("{e:#}"))
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> ApiError {
        ApiError::Internal(format!("query task failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let s: Status = ApiError::invalid("targets", "at least one target is needed").into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "targets: at least one target is needed");
        let s: Status = ApiError::from(WriterGone).into();
        assert_eq!(s.code(), Code::Unavailable);
        let s: Status = ApiError::NotFound("no session 7".into()).into();
        assert_eq!(s.code(), Code::NotFound);
        let s: Status = ApiError::PermissionDenied("x".into()).into();
        assert_eq!(s.code(), Code::PermissionDenied);
        let s: Status = ApiError::Unauthenticated("x".into()).into();
        assert_eq!(s.code(), Code::Unauthenticated);
    }
}
