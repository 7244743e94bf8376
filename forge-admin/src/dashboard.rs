//! The dashboard: a page at `/` (and `/dashboard`) next to the API, its assets compiled into
//! the binary (no CDN, works offline), and the one JSON endpoint the API lacks for it.
//!
//! The page is plain HTML, CSS and JavaScript modules (`forge-admin/assets/`); everything it
//! shows comes from the API's own endpoints, polled (with a pause control), so it needs
//! nothing the API does not already offer, and the API's access rules apply to it unchanged:
//! the page itself and its assets hold no data and are open; reads need the read token when
//! `[admin] read_token` is set; writes need `[admin] token`, which the operator pastes once
//! (kept in the tab's `sessionStorage`, sent as `Authorization: Bearer`: browsers never attach
//! it on their own, so no other site can make the operator's browser write - no cookies, no
//! CSRF). The page's links and requests are relative, so the router also works nested under a
//! prefix of your own application.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /`, `GET /dashboard` | the page |
//! | `GET /dashboard/assets/{file}` | its scripts, style sheet and icon |
//! | `GET /api/dashboard/series?series=&minutes=` | the aggregator's series (`Cluster::series`) of the last `minutes` (1 to 10,080, default 60), oldest first; `series`: comma-separated names, empty for all |

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{TimeDelta, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery};
use crate::{AdminState, auth};

/// The page.
const INDEX_HTML: &str = include_str!("../assets/index.html");

/// The assets under `/dashboard/assets/`: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../assets/style.css"),
    ),
    ("app.js", JS, include_str!("../assets/app.js")),
    ("api.js", JS, include_str!("../assets/api.js")),
    ("ui.js", JS, include_str!("../assets/ui.js")),
    ("pages.js", JS, include_str!("../assets/pages.js")),
    ("work.js", JS, include_str!("../assets/work.js")),
    ("charts.js", JS, include_str!("../assets/charts.js")),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("../assets/favicon.svg"),
    ),
];

const JS: &str = "text/javascript; charset=utf-8";

/// What the page may load and do: only its own origin's scripts, styles and API, no inline
/// script, not framed by another site.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes: the page and its assets (open: they hold no data) and its JSON
/// endpoint (behind the API's access rules).
pub(crate) fn routes(state: &AdminState) -> Router<AdminState> {
    let data = Router::new()
        .route("/api/dashboard/series", get(series))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::guard));
    Router::new()
        .route("/", get(index))
        .route("/dashboard", get(index))
        .route("/dashboard/assets/{file}", get(asset))
        .merge(data)
}

/// Security headers shared by the page and its assets.
fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Small, and the binary may change under the same URL: revalidate every time.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn index() -> Response {
    secured(
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            )],
            INDEX_HTML,
        )
            .into_response(),
    )
}

async fn asset(ApiPath(file): ApiPath<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => secured(
            (
                [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
                *body,
            )
                .into_response(),
        ),
        None => ApiError::not_found(format!("no dashboard asset {file:?}")).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SeriesQuery {
    series: Option<String>,
    minutes: Option<u32>,
}

/// The longest window the charts may ask for: a week (the default `rollup_retention`).
const MAX_MINUTES: u32 = 7 * 24 * 60;

async fn series(
    State(state): State<AdminState>,
    ApiQuery(query): ApiQuery<SeriesQuery>,
) -> ApiResult<Json<Value>> {
    let minutes = query.minutes.unwrap_or(60);
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(ApiError::bad_request(format!(
            "minutes must be between 1 and {MAX_MINUTES}, not {minutes}"
        ))
        .with("parameter", "minutes"));
    }
    let names: Vec<&str> = query
        .series
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(bad) = names
        .iter()
        .find(|n| n.len() > 64 || !n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
    {
        return Err(ApiError::bad_request(format!(
            "invalid series name {bad:?}: series are named like jobs_completed"
        ))
        .with("parameter", "series"));
    }
    if names.len() > 32 {
        return Err(ApiError::bad_request("at most 32 series at once").with("parameter", "series"));
    }
    let now = Utc::now();
    let since = now - TimeDelta::minutes(i64::from(minutes));
    let points = state.read(state.cluster.series(&names, since)).await?;
    Ok(Json(json!({
        "since": since,
        "now": now,
        "points": points,
    })))
}

#[cfg(test)]
mod contrast;

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        let served: Vec<&str> = ASSETS.iter().map(|(name, _, _)| *name).collect();
        let mut sources: Vec<(&str, &str)> = vec![("index.html", INDEX_HTML)];
        sources.extend(ASSETS.iter().map(|(name, _, body)| (*name, *body)));
        for (from, text) in sources {
            for quote in ['"', '\''] {
                for part in text.split(quote) {
                    let asset = part
                        .strip_prefix("./")
                        .or_else(|| part.strip_prefix("dashboard/assets/"));
                    if let Some(asset) = asset.filter(|a| {
                        a.ends_with(".js") || a.ends_with(".css") || a.ends_with(".svg")
                    }) {
                        assert!(
                            served.contains(&asset),
                            "{from} refers to {asset}, which is not served"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_page_has_no_inline_script_and_no_remote_resource() {
        let mut sources: Vec<(&str, &str)> = vec![("index.html", INDEX_HTML)];
        sources.extend(ASSETS.iter().map(|(name, _, body)| (*name, *body)));
        for (name, text) in sources {
            // SVG's namespace is a name, not a resource.
            let text = text.replace("http://www.w3.org/2000/svg", "");
            assert!(!text.contains("http://"), "{name} refers to a remote URL");
            assert!(!text.contains("https://"), "{name} refers to a remote URL");
            assert!(!text.contains("innerHTML"), "{name} writes HTML from data");
        }
        assert!(
            !INDEX_HTML.contains("<script>"),
            "inline script in the page"
        );
        assert!(!INDEX_HTML.contains("style="), "inline style in the page");
    }

    #[test]
    fn status_of_an_unknown_asset_is_404() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let response = runtime.block_on(asset(ApiPath("nope.js".to_owned())));
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let response = runtime.block_on(asset(ApiPath("app.js".to_owned())));
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response
                .headers()
                .contains_key(header::CONTENT_SECURITY_POLICY)
        );
    }
}
