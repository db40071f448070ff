//! The API's side of cluster mode: requests only the leader may serve are forwarded to it
//! ([`serve_where`], decided by the API's gate), and on the leader, changes are proposed to the
//! Raft log and answered once applied ([`propose`]).
//!
//! What the leader serves: writes (heartbeats, deletes, TTL changes) and the default,
//! linearizable reads of keys and services. `?consistency=stale` reads are served by any
//! member from what it has applied, with `X-Ttlwheel-Applied-Index`. A request forwarded once
//! is never forwarded again: a member that stopped leading meanwhile answers 503 `no_leader`.
//! The leader serves only while its lease holds ([`fence`]); otherwise 503 `no_quorum`.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, Method};
use axum::response::Response;

use super::{ApiError, AppState};
use crate::cluster::forward;
use crate::cluster::group_commit::Written;
use crate::cluster::node::{Cluster, ProposeError};
use crate::cluster::types::Command;
use crate::persist::record::Record;

/// `?consistency=`: how fresh a read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Consistency {
    /// The default: the leader's state.
    Linearizable,
    /// What this member has applied.
    Stale,
}

/// Reads and removes `consistency` from the request's query (the routes' own query types do
/// not know it); 400 for a value other than `stale` or `linearizable`.
fn take_consistency(request: &mut Request) -> Result<Consistency, ApiError> {
    let Some(query) = request.uri().query() else {
        return Ok(Consistency::Linearizable);
    };
    let mut consistency = Consistency::Linearizable;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=').map_or((pair, ""), |split| split) {
            ("consistency", "stale") => consistency = Consistency::Stale,
            ("consistency", "linearizable") => consistency = Consistency::Linearizable,
            ("consistency", other) => {
                return Err(ApiError::InvalidQuery(format!(
                    "consistency must be `linearizable` (the default) or `stale`, not `{other}`"
                )))
            }
            _ => rest.push(pair),
        }
    }
    if rest.len() == query.split('&').count() {
        return Ok(consistency);
    }
    let path = request.uri().path();
    let uri = match rest.is_empty() {
        true => path.to_owned(),
        false => format!("{path}?{}", rest.join("&")),
    };
    *request.uri_mut() = uri
        .parse()
        .map_err(|_| ApiError::InvalidQuery("the query cannot be read".into()))?;
    Ok(consistency)
}

/// Whether a request for `method` on `path` must be served by the leader.
fn needs_leader(method: &Method, path: &str, consistency: Consistency) -> bool {
    // Dead letters: the leader's are the current ones (a follower's trail by the reports it
    // has not applied yet); their ids are the same on every member.
    let keyed = path.starts_with("/v1/keys")
        || path == "/v1/services"
        || path.starts_with("/v1/webhooks/dead-letters");
    if path.starts_with("/v1/heartbeats") || path.starts_with("/v1/cluster/members") {
        return true;
    }
    if !keyed {
        return false;
    }
    let read = method == Method::GET || method == Method::HEAD;
    !read || consistency == Consistency::Linearizable
}

/// Where a request is served: decided before it runs ([`super::gate`]).
pub enum Serve {
    /// By this member's handlers: a single node's request, or the leader's.
    Here,
    /// By this member's handlers, from what it has applied; the answer says how fresh it is
    /// ([`stamp_staleness`]).
    HereStale(Arc<Cluster>),
    /// By the leader: this member forwards it ([`Cluster::forward`]).
    Forward(Arc<Cluster>),
}

/// Where `request` is served (see the module documentation), with `?consistency=` read and
/// removed; the answer instead when it is refused (a bad `consistency`, a leader that cannot
/// serve, a forwarded request that reached a member no longer leading).
pub fn serve_where(state: &AppState, request: &mut Request) -> Result<Serve, ApiError> {
    let consistency = take_consistency(request)?;
    let Some(cluster) = &state.cluster else {
        return Ok(Serve::Here);
    };
    if !needs_leader(request.method(), request.uri().path(), consistency) {
        return Ok(Serve::HereStale(Arc::clone(cluster)));
    }
    if cluster.is_leader() {
        fence(state)?;
        return Ok(Serve::Here);
    }
    if forward::is_forwarded(request.headers()) {
        return Err(ApiError::NoLeader(
            "this member no longer leads; retry: the cluster is electing or has elected another"
                .into(),
        ));
    }
    Ok(Serve::Forward(Arc::clone(cluster)))
}

/// Says in `response` how fresh a member's own answer is: the index it has applied, and (as
/// Consul's `X-Consul-LastContact`) how long since it heard from the leader.
pub fn stamp_staleness(cluster: &Cluster, response: &mut Response) {
    let applied = cluster.applied_index();
    let headers = response.headers_mut();
    headers.insert("x-ttlwheel-applied-index", HeaderValue::from(applied));
    if let Some(ms) = cluster.last_contact_ms() {
        headers.insert("x-ttlwheel-last-contact", HeaderValue::from(ms));
    }
}

/// 503 `no_quorum` unless this member may serve now (design section 6: it leads, is
/// promoted, and a quorum acknowledged it within the fence); always fine on a single node.
/// Checked before a leader serves anything, and again before a renewal it applied in memory
/// is acknowledged (a stall in between must not acknowledge it past the fence).
pub fn fence(state: &AppState) -> Result<(), ApiError> {
    match &state.cluster {
        Some(cluster) if !cluster.may_serve() => Err(ApiError::NoQuorum(
            "this member cannot confirm it still leads (no quorum acknowledged it within the \
             lease, or it is still taking over): retry, or send it to another member"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Proposes `records` as one entry and waits until it is applied here; where they went in
/// it, and what applying them did.
pub async fn propose(state: &AppState, records: Vec<Record>) -> Result<Written, ApiError> {
    let cluster = state
        .cluster
        .as_ref()
        .ok_or_else(|| ApiError::Internal("a proposal on a single node".into()))?;
    cluster.propose_writes(records).await.map_err(refused)
}

/// Proposes `record`, to apply only if its key still has `generation` (`Command::WriteIf`),
/// and waits until it is applied here; whether it applied.
pub async fn propose_if(
    state: &AppState,
    record: Record,
    generation: u32,
) -> Result<bool, ApiError> {
    let cluster = state
        .cluster
        .as_ref()
        .ok_or_else(|| ApiError::Internal("a proposal on a single node".into()))?;
    let command = Command::WriteIf {
        generation,
        record: Box::new(record),
    };
    let applied = cluster.propose(command).await.map_err(refused)?;
    Ok(applied.n_records == 1)
}

/// The API's answer to a proposal that did not commit.
fn refused(error: ProposeError) -> ApiError {
    match error {
        ProposeError::NotLeader { .. } => ApiError::NoLeader(
            "this member stopped leading before the change was committed; retry".into(),
        ),
        error @ ProposeError::NoQuorum(_) => ApiError::NoQuorum(error.to_string()),
        error @ ProposeError::Stopped(_) => ApiError::NoLeader(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, uri: &str) -> Request {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    fn needs(method: &str, uri: &str) -> bool {
        let mut request = request(method, uri);
        let consistency = take_consistency(&mut request).unwrap();
        needs_leader(request.method(), request.uri().path(), consistency)
    }

    #[test]
    fn the_consistency_parameter_is_read_and_removed_and_a_bad_one_refused() {
        let mut plain = request("GET", "/v1/keys?limit=5&consistency=stale&service=a");
        assert_eq!(take_consistency(&mut plain).unwrap(), Consistency::Stale);
        assert_eq!(plain.uri().to_string(), "/v1/keys?limit=5&service=a");
        let mut alone = request("GET", "/v1/keys/a?consistency=linearizable");
        assert_eq!(
            take_consistency(&mut alone).unwrap(),
            Consistency::Linearizable
        );
        assert_eq!(alone.uri().to_string(), "/v1/keys/a");
        let mut bad = request("GET", "/v1/keys?consistency=eventual");
        assert!(matches!(
            take_consistency(&mut bad),
            Err(ApiError::InvalidQuery(_))
        ));
    }

    #[test]
    fn writes_and_default_reads_of_keys_need_the_leader_stale_reads_and_the_rest_do_not() {
        for (method, uri) in [
            ("POST", "/v1/heartbeats"),
            ("POST", "/v1/heartbeats/batch"),
            ("DELETE", "/v1/keys/a"),
            ("PUT", "/v1/keys/a/ttl"),
            ("DELETE", "/v1/keys/a/ttl"),
            ("PUT", "/v1/keys/a/ttl?consistency=stale"),
            ("GET", "/v1/keys"),
            ("GET", "/v1/keys/a?x=1"),
            ("GET", "/v1/services"),
            ("GET", "/v1/webhooks/dead-letters"),
            ("POST", "/v1/webhooks/dead-letters/7/retry"),
        ] {
            assert!(needs(method, uri), "{method} {uri}");
        }
        for (method, uri) in [
            ("GET", "/v1/keys?consistency=stale"),
            ("GET", "/v1/keys/a/ttl?consistency=stale"),
            ("GET", "/v1/cluster"),
            ("GET", "/healthz"),
            ("GET", "/v1/events"),
            ("GET", "/metrics"),
            ("GET", "/v1/webhooks"),
            ("GET", "/v1/webhooks/dead-letters?consistency=stale"),
        ] {
            assert!(!needs(method, uri), "{method} {uri}");
        }
    }
}
