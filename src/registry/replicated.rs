//! The registry's side of cluster mode (`RegistryConfig::replicated`): what a change that must
//! go through the Raft log is proposed as, and what a request is answered once its entry has
//! been applied. The registry itself changes only when the state machine applies the entry
//! (`Registry::restore`), on every member alike.

use tokio::time::Instant;

use super::{Heartbeat, HeartbeatOutcome, Registry};
use crate::expiry::TimerKind;
use crate::persist::record::{Expiry, KeyState, Record};
use crate::types::Key;

impl Registry {
    /// The record a heartbeat that changes more than the deadline proposes: the key's whole
    /// state as it will be (the stored service, metadata and registration time where the
    /// heartbeat names none), and whether it creates the key.
    pub fn upsert_for(&self, heartbeat: &Heartbeat, now: Instant) -> (Record, bool) {
        let existing = self.get(&heartbeat.key, now);
        let now_unix_ms = self.clock.unix_ms(self.clock.at(now).ms);
        let created = existing.is_none();
        let (service, meta, registered_unix_ms) = match existing {
            Some(view) => (
                heartbeat.service.clone().or(view.service),
                heartbeat.meta.clone().or(view.meta),
                view.registered_at_ms,
            ),
            None => (
                heartbeat.service.clone(),
                heartbeat.meta.clone(),
                now_unix_ms,
            ),
        };
        let state = KeyState {
            key: heartbeat.key.clone(),
            service,
            meta,
            expiry: Expiry::Relative {
                ttl_ms: heartbeat.ttl.as_millis(),
            },
            registered_unix_ms,
            last_heartbeat_unix_ms: now_unix_ms,
        };
        (Record::Upsert(state), created)
    }

    /// The record a delete proposes, if the key is there to delete.
    pub fn deletion_for(&self, key: &Key, now: Instant) -> Option<Record> {
        self.get(key, now)?;
        let at_unix_ms = self.clock.unix_ms(self.clock.at(now).ms);
        Some(Record::Deleted {
            key: key.clone(),
            at_unix_ms,
        })
    }

    /// What a heartbeat whose record was applied is answered: the key as it is now (or, if a
    /// later change removed it meanwhile, as the heartbeat left it).
    pub fn outcome_after_log(
        &self,
        heartbeat: &Heartbeat,
        created: bool,
        now: Instant,
    ) -> HeartbeatOutcome {
        let ttl_ms = heartbeat.ttl.as_millis();
        let timer = TimerKind::for_ttl(ttl_ms, self.config.max_ttl_s);
        match self.get(&heartbeat.key, now) {
            Some(view) => HeartbeatOutcome {
                created,
                service: view.service,
                ttl_ms: view.ttl_ms.unwrap_or(ttl_ms),
                expires_in_ms: view.expires_in_ms.unwrap_or(ttl_ms),
                expires_at_ms: view.expires_at_ms.unwrap_or(0),
                timer: view.timer.unwrap_or(timer),
                lsn: 0,
            },
            None => {
                let now_unix_ms = self.clock.unix_ms(self.clock.at(now).ms);
                HeartbeatOutcome {
                    created,
                    service: heartbeat.service.clone(),
                    ttl_ms,
                    expires_in_ms: ttl_ms,
                    expires_at_ms: now_unix_ms + ttl_ms,
                    timer,
                    lsn: 0,
                }
            }
        }
    }
}
