//! `GET /`: the operators' dashboard, one page compiled into the binary.
//!
//! HTML, CSS and JavaScript are in `dashboard/index.html`; the page loads nothing from anywhere
//! but this server (`/v1/services`, `/v1/keys`, `/v1/events`), which the Content-Security-Policy
//! header enforces in the browser.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::IntoResponse;

const PAGE: &str = include_str!("dashboard/index.html");

/// Only this origin, and the inline style and script of the page itself.
const POLICY: &str = "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; \
                      script-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; form-action 'none'";

pub async fn dashboard() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
