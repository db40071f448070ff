//! Every route the API serves, by name: the one table that the router (`http::app`), the
//! request metrics (`metrics`) and the contract test all read.
//!
//! A leaf module: it imports nothing from the crate, so that `http` and `metrics` can both
//! depend on it without depending on each other. Entries are named constants, never addressed
//! by position, so reordering [`ALL`] cannot wire a handler to the wrong path or label a
//! metric with the wrong route.

/// One route: its path template (axum syntax, also the `route` label of the request metrics and
/// the path in `openapi.yaml`) and the methods it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub path: &'static str,
    pub methods: &'static [&'static str],
}

pub const HEARTBEATS: Route = Route {
    path: "/v1/heartbeats",
    methods: &["POST"],
};
pub const HEARTBEATS_BATCH: Route = Route {
    path: "/v1/heartbeats/batch",
    methods: &["POST"],
};
pub const KEYS: Route = Route {
    path: "/v1/keys",
    methods: &["GET"],
};
pub const KEY: Route = Route {
    path: "/v1/keys/{key}",
    methods: &["GET", "DELETE"],
};
pub const KEY_TTL: Route = Route {
    path: "/v1/keys/{key}/ttl",
    methods: &["GET", "PUT", "DELETE"],
};
pub const SERVICES: Route = Route {
    path: "/v1/services",
    methods: &["GET"],
};
pub const WEBHOOKS: Route = Route {
    path: "/v1/webhooks",
    methods: &["GET"],
};
pub const DEAD_LETTERS: Route = Route {
    path: "/v1/webhooks/dead-letters",
    methods: &["GET"],
};
pub const DEAD_LETTER_RETRY: Route = Route {
    path: "/v1/webhooks/dead-letters/{id}/retry",
    methods: &["POST"],
};
pub const GUARD: Route = Route {
    path: "/v1/guard",
    methods: &["GET"],
};
pub const GUARD_ENGAGE: Route = Route {
    path: "/v1/guard/engage",
    methods: &["POST"],
};
pub const GUARD_RELEASE: Route = Route {
    path: "/v1/guard/release",
    methods: &["POST"],
};
pub const SESSION: Route = Route {
    path: "/v1/session",
    methods: &["POST", "DELETE"],
};
pub const EVENTS: Route = Route {
    path: "/v1/events",
    methods: &["GET"],
};
pub const HEALTHZ: Route = Route {
    path: "/healthz",
    methods: &["GET"],
};
pub const READYZ: Route = Route {
    path: "/readyz",
    methods: &["GET"],
};
pub const CLUSTER: Route = Route {
    path: "/v1/cluster",
    methods: &["GET"],
};
pub const CLUSTER_MEMBERS: Route = Route {
    path: "/v1/cluster/members",
    methods: &["POST"],
};
pub const CLUSTER_MEMBER: Route = Route {
    path: "/v1/cluster/members/{id}",
    methods: &["DELETE"],
};
pub const CLUSTER_MEMBER_PROMOTE: Route = Route {
    path: "/v1/cluster/members/{id}/promote",
    methods: &["POST"],
};
pub const CLUSTER_SNAPSHOT: Route = Route {
    path: "/v1/cluster/snapshot",
    methods: &["POST"],
};
pub const OPENAPI: Route = Route {
    path: "/openapi.yaml",
    methods: &["GET"],
};
pub const METRICS: Route = Route {
    path: "/metrics",
    methods: &["GET"],
};
pub const DASHBOARD: Route = Route {
    path: "/",
    methods: &["GET"],
};

/// Every route, for those that need them all (metric labels, the contract test).
pub const ALL: &[Route] = &[
    HEARTBEATS,
    HEARTBEATS_BATCH,
    KEYS,
    KEY,
    KEY_TTL,
    SERVICES,
    WEBHOOKS,
    DEAD_LETTERS,
    DEAD_LETTER_RETRY,
    GUARD,
    GUARD_ENGAGE,
    GUARD_RELEASE,
    SESSION,
    EVENTS,
    HEALTHZ,
    READYZ,
    CLUSTER,
    CLUSTER_MEMBERS,
    CLUSTER_MEMBER,
    CLUSTER_MEMBER_PROMOTE,
    CLUSTER_SNAPSHOT,
    OPENAPI,
    METRICS,
    DASHBOARD,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_listed_once() {
        let mut paths: Vec<&str> = ALL.iter().map(|route| route.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), ALL.len());
    }
}
