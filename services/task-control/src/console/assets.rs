//! The console's page: one HTML file, one script and one style sheet, built into the binary so
//! that it works with no network beyond task-control.

use axum::{
    extract::Path,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// `GET /`.
pub async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
        .into_response()
}

/// `GET /assets/{name}`.
pub async fn file(Path(name): Path<String>) -> Response {
    let (kind, body) = match name.as_str() {
        "app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "app.css" => ("text/css; charset=utf-8", STYLE),
        _ => return (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
