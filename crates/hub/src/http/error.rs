//! The API's one error shape: `{"error": "..."}` with a fitting status, for every route,
//! and the status each fleet error maps to.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::fleet::FleetError;
use crate::proto::hub::ErrorBody;
use crate::store::StoreError;

/// An answer other than success: its status and a message for the client.
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    /// Seconds for a `Retry-After`.
    retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// What the client is told.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// How it ends a request, for the audit log.
    pub(crate) fn outcome(&self) -> String {
        format!("{} {}", self.status.as_u16(), self.message)
    }

    /// 429: the source failed to authenticate too often; it may try again in `wait`.
    pub(crate) fn throttled(wait: std::time::Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "too many failed authentications from this address: retry in {} s",
                secs.max(1)
            ),
            retry_after: Some(secs.max(1)),
        }
    }
}

/// How a request ended, for the audit log: its status and, for a refusal, why.
pub(super) fn outcome(resp: &Response) -> String {
    let status = resp.status();
    match resp.extensions().get::<Refusal>() {
        Some(r) => format!("{} {}", status.as_u16(), r.0),
        None => status.as_u16().to_string(),
    }
}

/// Whether `status` refuses the caller (as the audit log counts refusals).
pub(super) fn is_refusal(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    )
}

/// What a refused request was told, for the audit log.
#[derive(Debug, Clone)]
pub(super) struct Refusal(pub String);

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
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
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
            crate::metrics::STORE_ERRORS.inc();
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

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// What a caller's rights do not reach: 403, naming its selection or scopes.
impl From<crate::access::Exceeds> for ApiError {
    fn from(e: crate::access::Exceeds) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, e.to_string())
    }
}

impl From<crate::access::AccessError> for ApiError {
    fn from(e: crate::access::AccessError) -> Self {
        use crate::access::AccessError;
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
