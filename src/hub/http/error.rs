//! The API's one error shape: `{"error": "..."}` with a fitting status, for every route,
//! and the status each fleet error maps to.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::hub::fleet::FleetError;
use crate::hub::store::StoreError;
use crate::proto::hub::ErrorBody;

/// An answer other than success: its status and a message for the client.
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// What a refused request was told, for the audit log.
#[derive(Debug, Clone)]
pub(crate) struct Refusal(pub(crate) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let refusal = Refusal(self.message.clone());
        let mut resp = (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        resp.extensions_mut().insert(refusal);
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        if matches!(e, FleetError::Store(_)) {
            crate::hub::metrics::STORE_ERRORS.inc();
        }
        let status = match &e {
            FleetError::NoSuchAgent(_) => StatusCode::NOT_FOUND,
            FleetError::BadToken(_) | FleetError::Revoked(_) => StatusCode::UNAUTHORIZED,
            FleetError::Exists(_) => StatusCode::CONFLICT,
            FleetError::BadId { .. } | FleetError::BadSetting { .. } => StatusCode::BAD_REQUEST,
            FleetError::NoSuchJob(_) => StatusCode::NOT_FOUND,
            FleetError::JobExists(_) | FleetError::RevokedAgent(_) => StatusCode::CONFLICT,
            FleetError::TooManyJobs { .. } | FleetError::QueueFull(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            FleetError::JobToken(_) => StatusCode::UNAUTHORIZED,
            FleetError::NoSuchRelease(_) => StatusCode::NOT_FOUND,
            FleetError::NotHalted(_) => StatusCode::CONFLICT,
            FleetError::BadEnrolToken => StatusCode::UNAUTHORIZED,
            FleetError::EnrolRefused { .. } | FleetError::OutOfScope(_) => StatusCode::FORBIDDEN,
            FleetError::IdTaken { .. } | FleetError::IdRetired { .. } => StatusCode::CONFLICT,
            FleetError::NoSuchRollout(_) | FleetError::NotForPlatform { .. } => {
                StatusCode::NOT_FOUND
            }
            FleetError::RolloutClash(_)
            | FleetError::RolloutState { .. }
            | FleetError::Halted { .. } => StatusCode::CONFLICT,
            FleetError::StoreLost | FleetError::CatchingUp(_) => StatusCode::SERVICE_UNAVAILABLE,
            FleetError::AheadOfHub { .. } => StatusCode::BAD_REQUEST,
            FleetError::Store(s) if s.is_disk_full() => {
                tracing::error!(error = %crate::error_chain(&e), "the hub's disk is full");
                return ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "the hub's database has no room left (its disk is full): nothing was changed; retry once the hub's operator has made room",
                );
            }
            FleetError::Store(s @ StoreError::GenerationsExhausted(_)) => {
                tracing::error!(error = %crate::error_chain(s), "no change can be made");
                return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, s.to_string());
            }
            FleetError::Store(_) => {
                tracing::error!(error = %crate::error_chain(&e), "the hub's store failed");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the hub could not reach its database; see the hub's log",
                );
            }
        };
        ApiError::new(status, e.to_string())
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// What a caller's rights do not reach: 403, naming its selection or scopes.
impl From<crate::hub::access::Exceeds> for ApiError {
    fn from(e: crate::hub::access::Exceeds) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, e.to_string())
    }
}

impl From<crate::hub::access::AccessError> for ApiError {
    fn from(e: crate::hub::access::AccessError) -> Self {
        use crate::hub::access::AccessError;
        let status = match &e {
            AccessError::Bad { .. } => StatusCode::BAD_REQUEST,
            AccessError::NameTaken(_) => StatusCode::CONFLICT,
            AccessError::NoSuchToken(_) | AccessError::NoSuchEnrolToken(_) => StatusCode::NOT_FOUND,
            AccessError::Random(_) | AccessError::RootFile { .. } => {
                tracing::error!(error = %crate::error_chain(&e), "a token could not be made");
                StatusCode::INTERNAL_SERVER_ERROR
            }
            AccessError::Exceeds(_) => StatusCode::FORBIDDEN,
            AccessError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        match e {
            AccessError::Store(s) => FleetError::Store(s).into(),
            e => ApiError::new(status, e.to_string()),
        }
    }
}
