//! What each route asks of a caller: the one table of access rules (the matrix test walks it).
//!
//! Route-level rules only say which kind of scope may come in; rules about a key (its prefix,
//! its service) are checked by the handler that knows the key, with the methods of `Token`.

use crate::routes;

/// What a route and method require.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone (the dashboard page, the API document, sessions; `/healthz` and `/metrics` when
    /// `--auth-public` says so).
    Public,
    /// A heartbeat scope (or admin); the handler checks each key against it.
    Heartbeat,
    /// A read scope (or admin); the handler checks the key or the listing's filters.
    Read,
    /// An unnarrowed read scope (or admin): overviews.
    ReadAll,
    /// A heartbeat scope over the key (its own keys), or admin; the handler checks.
    DeleteKey,
    Admin,
}

/// Paths that `--auth-public` can leave open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublicPaths {
    pub healthz: bool,
    pub metrics: bool,
}

/// The access `method` on the route `template` requires.
pub fn access(template: &str, method: &str, public: PublicPaths) -> Access {
    let read_or_write = |read: Access, write: Access| {
        if method == "GET" || method == "HEAD" {
            read
        } else {
            write
        }
    };
    match template {
        t if t == routes::HEARTBEATS.path || t == routes::HEARTBEATS_BATCH.path => {
            Access::Heartbeat
        }
        t if t == routes::KEYS.path => Access::Read,
        t if t == routes::KEY.path => read_or_write(Access::Read, Access::DeleteKey),
        t if t == routes::KEY_TTL.path => read_or_write(Access::Read, Access::Admin),
        t if t == routes::SERVICES.path || t == routes::GUARD.path || t == routes::CLUSTER.path => {
            Access::ReadAll
        }
        t if t == routes::EVENTS.path => Access::Read,
        // A load balancer asks both without a token when `/healthz` is public.
        t if (t == routes::HEALTHZ.path || t == routes::READYZ.path) && public.healthz => {
            Access::Public
        }
        t if t == routes::METRICS.path && public.metrics => Access::Public,
        t if t == routes::HEALTHZ.path || t == routes::READYZ.path || t == routes::METRICS.path => {
            Access::ReadAll
        }
        t if t == routes::OPENAPI.path
            || t == routes::DASHBOARD.path
            || t == routes::SESSION.path =>
        {
            Access::Public
        }
        // Webhook status and dead letters, the guard's levers: admin.
        _ => Access::Admin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_method_has_a_rule_and_the_open_ones_are_few() {
        let mut public = Vec::new();
        for route in routes::ALL {
            for method in route.methods {
                if access(route.path, method, PublicPaths::default()) == Access::Public {
                    public.push(route.path);
                }
            }
        }
        public.dedup();
        assert_eq!(
            public,
            [
                routes::SESSION.path,
                routes::OPENAPI.path,
                routes::DASHBOARD.path
            ]
        );
    }
}
