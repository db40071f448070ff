//! [`Client`] and its builder: the v1 API's calls, over the failover of
//! [`crate::transport`], and keep-alive handles.
//!
//! A `Client` is cheap to clone (an `Arc`); clones share the connections, the endpoint
//! preference and the one keep-alive task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::Stream;
use reqwest::header::HeaderValue;
use reqwest::{Method, Url};
use tokio::sync::mpsc;

use crate::error::{Code, Error};
use crate::keep_alive::{self, KeepAlive, KeepAliveHandle};
use crate::model::{
    AliveState, ClusterStatus, Event, EventsQuery, ExpireAt, ExpireBody, ExpireCondition,
    ExpireOutcome, ExpiredKey, GuardStatus, Heartbeat, HeartbeatOutcome, KeyInfo, KeyTtl,
    ListQuery, Page, Services,
};
use crate::sse::Follow;
use crate::transport::{encode_segment, Call, RetryPolicy, Transport};

/// The endpoint a builder without one uses: a server with default flags.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7878";

/// TLS settings: which CA to trust, and a client certificate for mTLS. Without them, HTTPS
/// endpoints are checked against the platform's trusted roots.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    /// PEM CA certificates to trust instead of the platform's roots.
    ca_pem: Option<Vec<u8>>,
    /// A PEM certificate chain and its private key, to present (mTLS).
    identity_pem: Option<Vec<u8>>,
}

impl Tls {
    /// The platform's roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts only the CA certificates of `pem` (one or several).
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents the certificate chain and private key of `pem` (both in one PEM text).
    pub fn identity_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.identity_pem = Some(pem.into());
        self
    }
}

/// Builds a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    /// The endpoints as given.
    endpoints: Vec<String>,
    /// The bearer token.
    token: Option<String>,
    /// TLS settings.
    tls: Option<Tls>,
    /// The time limit of one attempt.
    request_timeout: Duration,
    /// The time limit of a connection's set-up.
    connect_timeout: Duration,
    /// The retry rules.
    retry: RetryPolicy,
    /// How long an idle connection is kept for reuse.
    pool_idle_timeout: Duration,
}

/// How long an idle connection is kept for reuse by default: below the server's default
/// `--header-read-timeout` (30 s), which also closes a kept-alive connection idle that long.
/// A request sent on a connection just as the server closes it fails (`IncompleteMessage` or
/// a reset; measured: 10 of 400 requests sent around the close), so the client lets the
/// connection go first. reqwest's own default is 90 s.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            token: None,
            tls: None,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            retry: RetryPolicy::default(),
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
        }
    }
}

impl ClientBuilder {
    /// Adds an endpoint: `http://host:port` or `https://host:port` (a base path is kept);
    /// `host:port` alone means `http://`. Without any, [`DEFAULT_ENDPOINT`].
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoints.push(endpoint.into());
        self
    }

    /// Adds several endpoints (cluster members, or several single nodes): a request that
    /// fails on one is retried on the next.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints.extend(endpoints.into_iter().map(Into::into));
        self
    }

    /// The token (`ttlw_<id>_<secret>`), sent as `Authorization: Bearer`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// TLS settings for `https://` endpoints.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The time limit of one attempt, up to the whole answer (default 10 s). Keep-alive
    /// requests use the key's interval if it is shorter.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The time limit of setting up a connection (default 2 s): a dead endpoint costs this.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an idle connection is kept for reuse (default [`DEFAULT_POOL_IDLE_TIMEOUT`],
    /// 20 s). Keep it below the server's `--header-read-timeout`, which closes connections
    /// idle that long: a request sent as the server closes its connection fails, and is
    /// retried after a delay.
    pub fn pool_idle_timeout(mut self, timeout: Duration) -> Self {
        self.pool_idle_timeout = timeout;
        self
    }

    /// Attempts per call, over every endpoint (default: three rounds of the endpoints).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry.attempts = Some(attempts.max(1));
        self
    }

    /// The delay before the first retry and the longest delay (default 50 ms and 2 s).
    pub fn retry_delays(mut self, first: Duration, max: Duration) -> Self {
        self.retry.base_delay = first;
        self.retry.max_delay = max.max(first);
        self
    }

    /// The client. Fails on an endpoint that is not an http(s) URL, a token that cannot be a
    /// header, or unreadable PEM.
    pub fn build(self) -> Result<Client, Error> {
        let raw = if self.endpoints.is_empty() {
            vec![DEFAULT_ENDPOINT.to_owned()]
        } else {
            self.endpoints
        };
        let endpoints = raw
            .iter()
            .map(|endpoint| parse_endpoint(endpoint))
            .collect::<Result<Vec<_>, _>>()?;
        let authorization = self
            .token
            .map(|token| {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                    .map_err(|_| Error::Config("the token cannot be sent in a header".into()))?;
                value.set_sensitive(true);
                Ok::<_, Error>(value)
            })
            .transpose()?;
        // An error means a provider is installed already, which is all reqwest needs.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_idle_timeout(self.pool_idle_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("ttlwheel-client/", env!("CARGO_PKG_VERSION")));
        if let Some(tls) = self.tls {
            if let Some(pem) = tls.ca_pem {
                let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|error| Error::Config(format!("CA certificates: {error}")))?;
                if certificates.is_empty() {
                    return Err(Error::Config("no CA certificate in the PEM".into()));
                }
                http = http.tls_certs_only(certificates);
            }
            if let Some(pem) = tls.identity_pem {
                let identity = reqwest::Identity::from_pem(&pem)
                    .map_err(|error| Error::Config(format!("client certificate: {error}")))?;
                http = http.identity(identity);
            }
        }
        let http = http
            .build()
            .map_err(|error| Error::Config(error.to_string()))?;
        Ok(Client {
            inner: Arc::new(Inner {
                transport: Arc::new(Transport::new(
                    http,
                    endpoints,
                    authorization,
                    self.retry,
                    self.request_timeout,
                )),
                batcher: OnceLock::new(),
                next_id: AtomicU64::new(1),
            }),
        })
    }
}

/// `endpoint` as a base URL.
fn parse_endpoint(endpoint: &str) -> Result<Url, Error> {
    let endpoint = endpoint.trim();
    let with_scheme = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    let url = Url::parse(&with_scheme)
        .map_err(|error| Error::Config(format!("endpoint `{endpoint}`: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(Error::Config(format!(
            "endpoint `{endpoint}`: must be http(s)://host[:port]"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::Config(format!(
            "endpoint `{endpoint}`: a base URL has no query or fragment"
        )));
    }
    Ok(url)
}

/// A ttlwheel client. See the crate documentation.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

/// What a client's clones share.
#[derive(Debug)]
struct Inner {
    /// Endpoints, connections, retries.
    transport: Arc<Transport>,
    /// The keep-alive task's queue, started with the first keep-alive.
    batcher: OnceLock<mpsc::UnboundedSender<keep_alive::Command>>,
    /// The next keep-alive's id.
    next_id: AtomicU64,
}

impl Client {
    /// A builder.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The configured endpoints.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner
            .transport
            .endpoints()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Registers `key` and keeps it alive until the handle is shut down (or dropped): see
    /// [`crate::keep_alive`] for the rules. Keep each key alive through one handle: two
    /// handles of one key heartbeat it twice, and the first shut down deletes it under the
    /// other (which then reports it lost and registers it again). Returns once the first heartbeat is accepted; a
    /// key the server refuses (invalid, or outside the token's scope) is an [`Error::Api`],
    /// and no endpoint answering is [`Error::Unavailable`]. Must run within a tokio runtime.
    pub async fn keep_alive(
        &self,
        key: impl Into<String>,
        options: KeepAlive,
    ) -> Result<KeepAliveHandle, Error> {
        let commands = self
            .inner
            .batcher
            .get_or_init(|| {
                let (commands, queue) = mpsc::unbounded_channel();
                tokio::spawn(keep_alive::run(Arc::clone(&self.inner.transport), queue));
                commands
            })
            .clone();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (handle, _) =
            keep_alive::start(self.clone(), commands, id, key.into(), options).await?;
        Ok(handle)
    }

    /// One heartbeat (`POST /v1/heartbeats`).
    pub async fn heartbeat(&self, heartbeat: &Heartbeat) -> Result<HeartbeatOutcome, Error> {
        let call = Call::new(Method::POST, "/v1/heartbeats".to_owned()).json(heartbeat);
        self.inner.transport.send(&call).await?.json()
    }

    /// Up to 1,000 heartbeats in one request (`POST /v1/heartbeats/batch`): one result per
    /// item, in order, each the heartbeat's answer or its own error.
    pub async fn heartbeat_batch(
        &self,
        heartbeats: &[Heartbeat],
    ) -> Result<Vec<Result<HeartbeatOutcome, Error>>, Error> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            heartbeats: &'a [Heartbeat],
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            results: Vec<Item>,
        }
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Item {
            Failed { error: crate::error::ErrorDetail },
            Accepted(HeartbeatOutcome),
        }
        let call =
            Call::new(Method::POST, "/v1/heartbeats/batch".to_owned()).json(&Body { heartbeats });
        let answer: Answer = self.inner.transport.send(&call).await?.json()?;
        Ok(answer
            .results
            .into_iter()
            .map(|item| match item {
                Item::Accepted(outcome) => Ok(outcome),
                Item::Failed { error } => Err(error.into_error(400)),
            })
            .collect())
    }

    /// One alive key (`GET /v1/keys/{key}`); a missing one is an error with
    /// [`Code::NotFound`] ([`Error::is_not_found`]).
    pub async fn get(&self, key: &str) -> Result<KeyInfo, Error> {
        let call = Call::new(Method::GET, key_path(key, "")?);
        self.inner.transport.send(&call).await?.json()
    }

    /// One page of alive keys, after `cursor`.
    pub async fn list_page(
        &self,
        query: &ListQuery,
        state: AliveState,
        cursor: Option<&str>,
    ) -> Result<Page<KeyInfo>, Error> {
        let state = match state {
            AliveState::Alive => "alive",
            AliveState::Held => "held",
        };
        self.page(query, state, cursor).await
    }

    /// One page of recently expired keys, after `cursor`.
    pub async fn list_expired_page(
        &self,
        query: &ListQuery,
        cursor: Option<&str>,
    ) -> Result<Page<ExpiredKey>, Error> {
        self.page(query, "expired", cursor).await
    }

    async fn page<T: serde::de::DeserializeOwned>(
        &self,
        query: &ListQuery,
        state: &'static str,
        cursor: Option<&str>,
    ) -> Result<Page<T>, Error> {
        let call = Call::new(Method::GET, "/v1/keys".to_owned())
            .query("service", query.service.as_ref())
            .query("prefix", query.prefix.as_ref())
            .query("state", Some(state))
            .query("limit", query.page_size)
            .query("cursor", cursor);
        self.inner.transport.send(&call).await?.json()
    }

    /// Every alive key matching `query`, sorted by key, page after page as the stream is read.
    ///
    /// ```rust,no_run
    /// # async fn run(client: ttlwheel_client::Client) -> Result<(), ttlwheel_client::Error> {
    /// use futures_util::StreamExt;
    /// use ttlwheel_client::ListQuery;
    ///
    /// let mut keys = std::pin::pin!(client.list(ListQuery::all().service("api")));
    /// while let Some(key) = keys.next().await {
    ///     let key = key?;
    ///     println!("{} expires in {:?} ms", key.key, key.expires_in_ms);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn list(
        &self,
        query: ListQuery,
    ) -> impl Stream<Item = Result<KeyInfo, Error>> + Send + 'static {
        self.pages(query, |client, query, cursor| async move {
            client
                .list_page(&query, AliveState::Alive, cursor.as_deref())
                .await
        })
    }

    /// Every alive key the mass-expiry guard holds.
    pub fn list_held(
        &self,
        query: ListQuery,
    ) -> impl Stream<Item = Result<KeyInfo, Error>> + Send + 'static {
        self.pages(query, |client, query, cursor| async move {
            client
                .list_page(&query, AliveState::Held, cursor.as_deref())
                .await
        })
    }

    /// Every recently expired key matching `query`, sorted by key.
    pub fn list_expired(
        &self,
        query: ListQuery,
    ) -> impl Stream<Item = Result<ExpiredKey, Error>> + Send + 'static {
        self.pages(query, |client, query, cursor| async move {
            client.list_expired_page(&query, cursor.as_deref()).await
        })
    }

    /// The items of every page, fetched as the stream is read; an error ends the stream.
    fn pages<T, F, Fut>(
        &self,
        query: ListQuery,
        fetch: F,
    ) -> impl Stream<Item = Result<T, Error>> + Send + 'static
    where
        T: Send + 'static,
        F: Fn(Client, ListQuery, Option<String>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Page<T>, Error>> + Send,
    {
        /// The listing between two items.
        struct Pager<T, F> {
            /// Where pages come from.
            client: Client,
            /// The filters.
            query: ListQuery,
            /// Fetches the page after a cursor.
            fetch: F,
            /// Items of the page being read.
            items: std::vec::IntoIter<T>,
            /// The next page's cursor; `None` after the last page (or an error).
            next: Option<Option<String>>,
        }
        let pager = Pager {
            client: self.clone(),
            query,
            fetch,
            items: Vec::new().into_iter(),
            next: Some(None),
        };
        futures_util::stream::unfold(pager, |mut pager| async move {
            loop {
                if let Some(item) = pager.items.next() {
                    return Some((Ok(item), pager));
                }
                let cursor = pager.next.take()?;
                match (pager.fetch)(pager.client.clone(), pager.query.clone(), cursor).await {
                    Ok(page) => {
                        pager.next = page.next_cursor.map(Some);
                        pager.items = page.keys.into_iter();
                    }
                    Err(error) => return Some((Err(error), pager)),
                }
            }
        })
    }

    /// Deletes a key (`DELETE /v1/keys/{key}`): subscribers get a `deleted` event. A missing
    /// key is an error with [`Code::NotFound`].
    pub async fn delete(&self, key: &str) -> Result<(), Error> {
        let call = Call::new(Method::DELETE, key_path(key, "")?);
        self.inner.transport.send(&call).await.map(drop)
    }

    /// A key's TTL (`GET /v1/keys/{key}/ttl`, Redis PTTL).
    pub async fn ttl(&self, key: &str) -> Result<KeyTtl, Error> {
        #[derive(serde::Deserialize)]
        struct Answer {
            ttl_ms: i64,
        }
        let call = Call::new(Method::GET, key_path(key, "/ttl")?);
        let answer: Answer = self.inner.transport.send(&call).await?.json()?;
        Ok(match u64::try_from(answer.ttl_ms) {
            Ok(ms) => KeyTtl::ExpiresIn(Duration::from_millis(ms)),
            Err(_) => KeyTtl::Persistent,
        })
    }

    /// Sets a key's deadline (`PUT /v1/keys/{key}/ttl`, Redis PEXPIRE / PEXPIREAT), if
    /// `condition` holds.
    pub async fn expire(
        &self,
        key: &str,
        at: ExpireAt,
        condition: Option<ExpireCondition>,
    ) -> Result<ExpireOutcome, Error> {
        let body = match at {
            ExpireAt::In(ms) => ExpireBody {
                ttl_ms: Some(ms),
                at_ms: None,
                condition,
            },
            ExpireAt::AtUnixMs(ms) => ExpireBody {
                ttl_ms: None,
                at_ms: Some(ms),
                condition,
            },
        };
        let call = Call::new(Method::PUT, key_path(key, "/ttl")?).json(&body);
        self.inner.transport.send(&call).await?.json()
    }

    /// Removes a key's TTL (`DELETE /v1/keys/{key}/ttl`, Redis PERSIST): whether it had one.
    pub async fn persist(&self, key: &str) -> Result<bool, Error> {
        #[derive(serde::Deserialize)]
        struct Answer {
            applied: bool,
        }
        let call = Call::new(Method::DELETE, key_path(key, "/ttl")?);
        let answer: Answer = self.inner.transport.send(&call).await?.json()?;
        Ok(answer.applied)
    }

    /// Alive and recently expired keys per service (`GET /v1/services`).
    pub async fn services(&self) -> Result<Services, Error> {
        let call = Call::new(Method::GET, "/v1/services".to_owned());
        self.inner.transport.send(&call).await?.json()
    }

    /// The mass-expiry guard's state (`GET /v1/guard`).
    pub async fn guard_status(&self) -> Result<GuardStatus, Error> {
        let call = Call::new(Method::GET, "/v1/guard".to_owned());
        self.inner.transport.send(&call).await?.json()
    }

    /// Holds due keys from now (`POST /v1/guard/engage`).
    pub async fn guard_engage(&self) -> Result<GuardStatus, Error> {
        let call = Call::new(Method::POST, "/v1/guard/engage".to_owned());
        self.inner.transport.send(&call).await?.json()
    }

    /// Ends the hold (`POST /v1/guard/release`): held keys expire at the bounded rate.
    pub async fn guard_release(&self) -> Result<GuardStatus, Error> {
        let call = Call::new(Method::POST, "/v1/guard/release".to_owned());
        self.inner.transport.send(&call).await?.json()
    }

    /// The cluster as the answering member sees it (`GET /v1/cluster`). A single node has no
    /// such route: [`Error::NotClustered`].
    pub async fn cluster_status(&self) -> Result<ClusterStatus, Error> {
        self.cluster_call(Call::new(Method::GET, "/v1/cluster".to_owned()))
            .await
    }

    /// Adds member `id` as a learner (`POST /v1/cluster/members`, admin; served by the
    /// leader): it reaches its peers at `peer_addr` (`HOST:PORT`) and clients at `api_addr`
    /// (a URL). Adding it again with the same addresses answers as if done. The cluster as
    /// the leader sees it once committed.
    pub async fn add_member(
        &self,
        id: u64,
        peer_addr: &str,
        api_addr: &str,
    ) -> Result<ClusterStatus, Error> {
        let body = serde_json::json!({ "id": id, "peer_addr": peer_addr, "api_addr": api_addr });
        let call = Call::new(Method::POST, "/v1/cluster/members".to_owned()).json(&body);
        self.cluster_call(call).await
    }

    /// Makes learner `id` a voter (`POST /v1/cluster/members/{id}/promote`, admin). Refused
    /// with `not_caught_up` until it is within 64 entries of the leader, and with
    /// `membership_changing` while another change is committed: both are worth retrying.
    pub async fn promote_member(&self, id: u64) -> Result<ClusterStatus, Error> {
        let path = format!("/v1/cluster/members/{id}/promote");
        self.cluster_call(Call::new(Method::POST, path)).await
    }

    /// Removes member `id`, voter or learner (`DELETE /v1/cluster/members/{id}`, admin). Stop
    /// its process afterwards, and do not start it again on the same data directory.
    pub async fn remove_member(&self, id: u64) -> Result<ClusterStatus, Error> {
        let path = format!("/v1/cluster/members/{id}");
        self.cluster_call(Call::new(Method::DELETE, path)).await
    }

    /// A cluster route's answer; a single node has none: [`Error::NotClustered`].
    async fn cluster_call(&self, call: Call) -> Result<ClusterStatus, Error> {
        match self.inner.transport.send(&call).await {
            Ok(answer) => answer.json(),
            Err(Error::Api {
                code: Code::RouteNotFound,
                ..
            }) => Err(Error::NotClustered),
            Err(Error::Api {
                code: Code::Other(code),
                ..
            }) if code == "not_a_cluster" => Err(Error::NotClustered),
            Err(error) => Err(error),
        }
    }

    /// `GET /healthz`: the body of a healthy server's answer. An unhealthy one answers 503
    /// (`lagging`, `recovering`), which is retried on the next endpoint like any 503, so
    /// [`Error::Unavailable`] means no endpoint is healthy.
    pub async fn health(&self) -> Result<serde_json::Value, Error> {
        let call = Call::new(Method::GET, "/healthz".to_owned());
        self.inner.transport.send(&call).await?.json()
    }

    /// The live event stream (`GET /v1/events`), connected: every event after this call
    /// returns is in it. It is followed across reconnects with `Last-Event-ID` (see
    /// [`crate::sse`]), and ends after an error: the server's refusal, or no endpoint
    /// answering for [`crate::sse::RECONNECT_FOR`].
    ///
    /// ```rust,no_run
    /// # async fn run(client: ttlwheel_client::Client) -> Result<(), ttlwheel_client::Error> {
    /// use futures_util::StreamExt;
    /// use ttlwheel_client::EventsQuery;
    ///
    /// let mut events = std::pin::pin!(client.events(EventsQuery::default()).await?);
    /// while let Some(event) = events.next().await {
    ///     let event = event?;
    ///     match event.kind.as_str() {
    ///         "expired" => println!("{} died", event.key().unwrap_or_default()),
    ///         "reset" => println!("events were missed: re-read the lists"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn events(
        &self,
        query: EventsQuery,
    ) -> Result<impl Stream<Item = Result<Event, Error>> + Send + 'static, Error> {
        let follow = Follow::connected(Arc::clone(&self.inner.transport), query).await?;
        Ok(futures_util::stream::unfold(
            follow,
            |mut follow| async move {
                let item = follow.next().await?;
                Some((item, follow))
            },
        ))
    }
}

/// `/v1/keys/{key}{rest}`, the key percent-encoded.
fn key_path(key: &str, rest: &str) -> Result<String, Error> {
    Ok(format!("/v1/keys/{}{rest}", encode_segment(key)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls_and_a_bare_address_means_http() {
        fn check(endpoint: &str, expected: Result<&str, ()>) {
            let parsed = parse_endpoint(endpoint).map(|url| url.to_string());
            assert_eq!(parsed.as_deref().map_err(|_| ()), expected, "{endpoint}");
        }
        check("127.0.0.1:7878", Ok("http://127.0.0.1:7878/"));
        check("http://localhost:7878", Ok("http://localhost:7878/"));
        check("https://ttl.example/base", Ok("https://ttl.example/base"));
        check(" http://[::1]:9 ", Ok("http://[::1]:9/"));
        check("ftp://ttl.example", Err(()));
        check("http://", Err(()));
        check("http://h:7878/?x=1", Err(()));
    }

    #[test]
    fn a_builder_without_endpoints_uses_the_default_one() {
        let client = Client::builder().build().expect("builds");
        assert_eq!(client.endpoints(), vec!["http://127.0.0.1:7878/"]);
        let error = Client::builder()
            .endpoint("mailto:x")
            .build()
            .expect_err("refused");
        assert!(matches!(error, Error::Config(_)), "{error}");
        let error = Client::builder()
            .token("bad\ntoken")
            .build()
            .expect_err("refused");
        assert!(matches!(error, Error::Config(_)), "{error}");
    }
}
