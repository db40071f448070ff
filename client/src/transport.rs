//! Endpoints and failover: one request, tried on the endpoints in turn until one answers.
//!
//! The rules:
//! - an attempt that cannot connect, times out, breaks off, or gets 502/503/504 is retried on
//!   the next endpoint after a backoff with jitter ([`crate::backoff::retry_delay`]); any other
//!   answer ends the call (2xx: done; else a typed [`Error::Api`]);
//! - the endpoint that last answered is tried first next time, so a client sticks to a working
//!   member instead of walking through a dead one on every call;
//! - a `Retry-After` on a 503 is honoured only when the retry goes to the same endpoint (one
//!   endpoint configured): it says when *that* server expects to be ready, nothing about others;
//! - a 503 naming the leader in [`LEADER_HEADER`] sends the next attempt to that endpoint, if it
//!   is one of the configured ones (a token is never sent to an address a server names).
//!
//! Deliberately absent: redirects (not followed: a token must not travel to another host) and
//! retries of 4xx answers (the same request would get the same answer).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};

use crate::backoff;
use crate::error::{api_error, Error};

/// The header a cluster member that cannot serve a request (a follower that will not forward
/// it) names the leader's API address in, on a 503: `x-ttlwheel-leader: http://10.0.0.2:7878`.
/// Single nodes never send it; the cluster (issue 28) is expected to.
pub const LEADER_HEADER: &str = "x-ttlwheel-leader";

/// How calls are retried.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per call in all, over every endpoint; `None`: three rounds of the endpoints
    /// (at least three attempts).
    pub attempts: Option<u32>,
    /// The first retry's delay (then doubled, see [`backoff::retry_delay`]).
    pub base_delay: Duration,
    /// The longest delay between two attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: None,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// Attempts per call with `endpoints` endpoints.
    pub fn attempts_for(&self, endpoints: usize) -> u32 {
        self.attempts
            .unwrap_or_else(|| (3 * endpoints as u32).max(3))
            .max(1)
    }
}

/// One request, as it is sent to any endpoint: the body is bytes so it can be sent again.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    /// The method.
    pub(crate) method: Method,
    /// The path, percent-encoded, from the endpoint's base (`/v1/keys/a%2Fb`).
    pub(crate) path: String,
    /// Query parameters.
    pub(crate) query: Vec<(&'static str, String)>,
    /// A JSON body.
    pub(crate) body: Option<Vec<u8>>,
    /// Extra headers (`Last-Event-ID`).
    pub(crate) headers: HeaderMap,
    /// The time limit of one attempt up to the answer's head (and, for a whole answer, its
    /// body); `None`: the client's request timeout.
    pub(crate) timeout: Option<Duration>,
}

impl Call {
    /// A call without body.
    pub(crate) fn new(method: Method, path: String) -> Self {
        Self {
            method,
            path,
            query: Vec::new(),
            body: None,
            headers: HeaderMap::new(),
            timeout: None,
        }
    }

    /// With a JSON body.
    pub(crate) fn json(mut self, body: &impl serde::Serialize) -> Self {
        self.body = Some(serde_json::to_vec(body).expect("our request types serialize to JSON"));
        self
    }

    /// With a query parameter, if it has a value.
    pub(crate) fn query(mut self, name: &'static str, value: Option<impl ToString>) -> Self {
        if let Some(value) = value {
            self.query.push((name, value.to_string()));
        }
        self
    }
}

/// A successful answer, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The body.
    pub(crate) body: Vec<u8>,
    /// The endpoint that answered (for error messages).
    pub(crate) endpoint: String,
}

impl Answer {
    /// The body as `T`.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|error| Error::Decode {
            endpoint: self.endpoint.clone(),
            detail: error.to_string(),
        })
    }
}

/// Why one attempt did not settle the call.
#[derive(Debug)]
pub(crate) struct Retryable {
    /// What happened, for [`Error::Unavailable`].
    pub(crate) why: String,
    /// The wait the server asked for.
    pub(crate) retry_after: Option<Duration>,
    /// The endpoint to try next, when the server named the leader.
    pub(crate) leader: Option<usize>,
}

/// How one attempt ended.
pub(crate) enum Attempt<T> {
    /// The call is settled: an answer, or the server's refusal.
    Settled(Result<T, Error>),
    /// Try again (elsewhere).
    Retry(Retryable),
}

/// The endpoints, the HTTP client and the retry rules, shared by a client's clones and its
/// keep-alive task.
#[derive(Debug)]
pub(crate) struct Transport {
    /// reqwest's client: a connection pool per endpoint.
    http: reqwest::Client,
    /// The base URLs, without a trailing `/`; never empty.
    endpoints: Vec<Url>,
    /// `Bearer <token>`, marked sensitive (never logged).
    authorization: Option<HeaderValue>,
    /// The endpoint to try first: the one that answered last.
    preferred: AtomicUsize,
    /// The retry rules.
    pub(crate) retry: RetryPolicy,
    /// The default time limit of one attempt.
    pub(crate) request_timeout: Duration,
}

impl Transport {
    pub(crate) fn new(
        http: reqwest::Client,
        endpoints: Vec<Url>,
        authorization: Option<HeaderValue>,
        retry: RetryPolicy,
        request_timeout: Duration,
    ) -> Self {
        assert!(!endpoints.is_empty(), "the builder checks for an endpoint");
        Self {
            http,
            endpoints,
            authorization,
            preferred: AtomicUsize::new(0),
            retry,
            request_timeout,
        }
    }

    /// The configured endpoints.
    pub(crate) fn endpoints(&self) -> &[Url] {
        &self.endpoints
    }

    /// Sends `call`, failing over as the module documentation says, and reads the answer.
    pub(crate) async fn send(&self, call: &Call) -> Result<Answer, Error> {
        self.with_retries(call, |index, call| self.attempt_whole(index, call))
            .await
    }

    /// Sends `call` as [`Transport::send`] does and returns the answer with its body unread
    /// (a stream).
    pub(crate) async fn open(&self, call: &Call) -> Result<reqwest::Response, Error> {
        self.with_retries(call, |index, call| self.attempt_head(index, call))
            .await
    }

    /// One attempt of `call` on the preferred endpoint; a retryable failure moves the
    /// preference to the next endpoint (or the named leader). For callers with retry rules of
    /// their own (the keep-alive task retries per key, until each key's deadline).
    pub(crate) async fn send_once(&self, call: &Call) -> Attempt<Answer> {
        let index = self.preferred.load(Ordering::Relaxed) % self.endpoints.len();
        let attempt = self.attempt_whole(index, call).await;
        match &attempt {
            Attempt::Settled(_) => self.preferred.store(index, Ordering::Relaxed),
            Attempt::Retry(retry) => self.preferred.store(
                retry.leader.unwrap_or((index + 1) % self.endpoints.len()),
                Ordering::Relaxed,
            ),
        }
        attempt
    }

    async fn with_retries<'a, T, F, Fut>(&'a self, call: &'a Call, attempt: F) -> Result<T, Error>
    where
        F: Fn(usize, &'a Call) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>> + 'a,
    {
        let n = self.endpoints.len();
        let attempts = self.retry.attempts_for(n);
        let mut index = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures = Vec::new();
        for number in 1..=attempts {
            match attempt(index, call).await {
                Attempt::Settled(result) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return result;
                }
                Attempt::Retry(retry) => {
                    tracing::debug!(endpoint = %self.endpoints[index], why = %retry.why, attempt = number, "retrying on the next endpoint");
                    failures.push(format!("{}: {}", self.endpoints[index], retry.why));
                    let next = retry.leader.unwrap_or((index + 1) % n);
                    if number == attempts {
                        break;
                    }
                    let mut delay = backoff::retry_delay(
                        number,
                        self.retry.base_delay,
                        self.retry.max_delay,
                        fastrand::f64(),
                    );
                    if next == index {
                        if let Some(asked) = retry.retry_after {
                            delay = delay.max(asked.min(self.retry.max_delay));
                        }
                    }
                    index = next;
                    tokio::time::sleep(delay).await;
                }
            }
        }
        // The next call starts where this one would have gone on.
        self.preferred.store(index, Ordering::Relaxed);
        Err(Error::Unavailable { failures })
    }

    /// The request of `call` to endpoint `index`.
    fn request(&self, index: usize, call: &Call) -> reqwest::RequestBuilder {
        let base = &self.endpoints[index];
        let mut url = format!("{}{}", base.as_str().trim_end_matches('/'), call.path);
        if !call.query.is_empty() {
            let query: String = call
                .query
                .iter()
                .map(|(name, value)| format!("{name}={}", encode_query(value)))
                .collect::<Vec<_>>()
                .join("&");
            url.push('?');
            url.push_str(&query);
        }
        let mut request = self
            .http
            .request(call.method.clone(), url)
            .headers(call.headers.clone());
        if let Some(authorization) = &self.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization.clone());
        }
        if let Some(body) = &call.body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
        }
        request
    }

    /// One attempt up to the answer's head; a 2xx answer is returned unread.
    async fn attempt_head(&self, index: usize, call: &Call) -> Attempt<reqwest::Response> {
        let limit = call.timeout.unwrap_or(self.request_timeout);
        let sent = tokio::time::timeout(limit, self.request(index, call).send()).await;
        let response = match sent {
            Err(_) => return self.retry(format!("no answer within {limit:?}"), None),
            Ok(Err(error)) => return self.retry(describe(&error), None),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Attempt::Settled(Ok(response));
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| backoff::parse_retry_after(value, SystemTime::now()));
        let leader = response
            .headers()
            .get(LEADER_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|named| self.endpoint_named(named));
        let body = tokio::time::timeout(limit, response.bytes())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        if matches!(
            status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        ) {
            let error = api_error(status.as_u16(), &body);
            return Attempt::Retry(Retryable {
                why: error.to_string(),
                retry_after,
                leader,
            });
        }
        Attempt::Settled(Err(api_error(status.as_u16(), &body)))
    }

    /// One attempt, the answer read whole.
    async fn attempt_whole(&self, index: usize, call: &Call) -> Attempt<Answer> {
        let response = match self.attempt_head(index, call).await {
            Attempt::Settled(Ok(response)) => response,
            Attempt::Settled(Err(error)) => return Attempt::Settled(Err(error)),
            Attempt::Retry(retry) => return Attempt::Retry(retry),
        };
        let limit = call.timeout.unwrap_or(self.request_timeout);
        match tokio::time::timeout(limit, response.bytes()).await {
            Ok(Ok(body)) => Attempt::Settled(Ok(Answer {
                body: body.to_vec(),
                endpoint: self.endpoints[index].to_string(),
            })),
            Ok(Err(error)) => self.retry(describe(&error), None),
            Err(_) => self.retry(format!("answer not read within {limit:?}"), None),
        }
    }

    fn retry<T>(&self, why: String, leader: Option<usize>) -> Attempt<T> {
        Attempt::Retry(Retryable {
            why,
            retry_after: None,
            leader,
        })
    }

    /// The index of the configured endpoint `named` stands for (same scheme, host and port).
    fn endpoint_named(&self, named: &str) -> Option<usize> {
        let named = Url::parse(named).ok()?;
        self.endpoints.iter().position(|endpoint| {
            endpoint.scheme() == named.scheme()
                && endpoint.host_str() == named.host_str()
                && endpoint.port_or_known_default() == named.port_or_known_default()
        })
    }
}

/// A transport error in a few words (reqwest's display hides the cause).
fn describe(error: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = if error.is_connect() {
        "cannot connect".to_owned()
    } else if error.is_timeout() {
        "timed out".to_owned()
    } else {
        error.to_string()
    };
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Characters left as they are in a path segment or a query value: RFC 3986's unreserved
/// ones. Everything else (`/` in keys above all) is percent-encoded.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `key` as one path segment: `/` becomes `%2F`, as the API asks. The keys `.` and `..` have
/// none: URL parsers remove dot segments, encoded or not (WHATWG URL), so they cannot be named
/// in a path (they can still be heartbeated and listed).
pub(crate) fn encode_segment(key: &str) -> Result<String, Error> {
    if key == "." || key == ".." {
        return Err(Error::Config(format!(
            "the key `{key}` cannot be named in a URL path (dot segments are removed)"
        )));
    }
    Ok(percent_encoding::utf8_percent_encode(key, UNRESERVED).to_string())
}

/// A query value, percent-encoded.
fn encode_query(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_path_segment_whatever_they_hold() {
        fn check(key: &str, expected: &str) {
            assert_eq!(encode_segment(key).unwrap(), expected, "{key}");
        }
        check("api/host-1:8080", "api%2Fhost-1%3A8080");
        check("plain.key_1~x", "plain.key_1~x");
        check("a b?c#d%e", "a%20b%3Fc%23d%25e");
        check("ключ", "%D0%BA%D0%BB%D1%8E%D1%87");
        check("...", "...");
        assert!(encode_segment("..").is_err());
        assert!(encode_segment(".").is_err());
    }

    #[test]
    fn default_attempts_are_three_rounds_of_the_endpoints() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.attempts_for(1), 3);
        assert_eq!(policy.attempts_for(3), 9);
        let one = RetryPolicy {
            attempts: Some(0),
            ..RetryPolicy::default()
        };
        assert_eq!(one.attempts_for(3), 1);
    }
}
