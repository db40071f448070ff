//! The per-shard structures behind the liveness lists: an ordered index of alive keys and a
//! bounded log of recently expired ones.
//!
//! Both are updated on registration, expiry and deletion only, never on a renewal, so the
//! heartbeat hot path does not pay for them. A page of alive keys is a range scan from the
//! cursor: O(log n + page) per shard, whatever the number of keys. The expired log is bounded
//! (`--expired-max`), so it is kept unordered (O(1) per expiry, which matters in a mass expiry)
//! and a page of it is selected per request in O(records) time.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ops::Bound;

use super::services::ServiceId;
use crate::types::{Key, Meta};

/// What a page asks for. Keys are returned in byte order of their UTF-8 text.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub service: Option<ServiceId>,
    pub prefix: Option<String>,
    /// Only keys held by the mass-expiry guard.
    pub held_only: bool,
    /// Only keys strictly after this one (the cursor of the previous page).
    pub after: Option<String>,
}

impl ListFilter {
    /// The lowest key the scan may start at.
    fn start(&self) -> Bound<Key> {
        let prefix = self.prefix.as_deref().unwrap_or("");
        match self.after.as_deref() {
            Some(after) if after >= prefix => key_bound(after, Bound::Excluded),
            _ => key_bound(prefix, Bound::Included),
        }
    }

    /// Whether the scan may stop at `key`: no later key can match the prefix.
    fn past_prefix(&self, key: &Key) -> bool {
        self.prefix
            .as_deref()
            .is_some_and(|prefix| !key.as_str().starts_with(prefix) && key.as_str() > prefix)
    }
}

/// A key as a range bound; text that is not a valid key (empty, say) bounds nothing.
fn key_bound(text: &str, bound: fn(Key) -> Bound<Key>) -> Bound<Key> {
    Key::new(text).map_or(Bound::Unbounded, bound)
}

/// Alive keys in order, overall and per service.
#[derive(Debug, Default)]
pub(super) struct OrderedIndex {
    by_key: BTreeSet<Key>,
    /// Only keys that have a service.
    by_service: BTreeSet<(ServiceId, Key)>,
}

impl OrderedIndex {
    pub fn insert(&mut self, key: &Key, service: ServiceId) {
        self.by_key.insert(key.clone());
        if !service.is_none() {
            self.by_service.insert((service, key.clone()));
        }
    }

    pub fn remove(&mut self, key: &Key, service: ServiceId) {
        self.by_key.remove(key);
        if !service.is_none() {
            self.by_service.remove(&(service, key.clone()));
        }
    }

    /// Checks that the index holds exactly `alive` (every alive key and its service); panics
    /// naming the difference. O(n log n): for tests.
    pub fn check_invariants<'a>(&self, alive: impl Iterator<Item = (&'a Key, ServiceId)>) {
        let mut by_key = BTreeSet::new();
        let mut by_service = BTreeSet::new();
        for (key, service) in alive {
            by_key.insert(key.clone());
            if !service.is_none() {
                by_service.insert((service, key.clone()));
            }
        }
        assert!(
            self.by_key == by_key,
            "the ordered index differs from the alive keys: {:?} listed, {:?} alive",
            self.by_key
                .symmetric_difference(&by_key)
                .take(5)
                .collect::<Vec<_>>(),
            by_key.len()
        );
        assert!(
            self.by_service == by_service,
            "the per-service index differs from the alive keys' services: {:?}",
            self.by_service
                .symmetric_difference(&by_service)
                .take(5)
                .collect::<Vec<_>>()
        );
    }

    /// Keys matching `filter` in order, from the cursor on, for the caller to take from.
    pub fn scan<'a>(&'a self, filter: &'a ListFilter) -> Box<dyn Iterator<Item = &'a Key> + 'a> {
        let start = filter.start();
        let keys: Box<dyn Iterator<Item = &Key>> = match filter.service {
            None => Box::new(self.by_key.range((start, Bound::Unbounded))),
            Some(service) => {
                let low = match start {
                    Bound::Included(key) => Bound::Included((service, key)),
                    Bound::Excluded(key) => Bound::Excluded((service, key)),
                    // " " is the smallest valid key: control characters are refused.
                    Bound::Unbounded => {
                        Bound::Included((service, Key::new(" ").expect("valid key")))
                    }
                };
                let range = self.by_service.range((low, Bound::Unbounded));
                Box::new(
                    range
                        .take_while(move |(id, _)| *id == service)
                        .map(|(_, key)| key),
                )
            }
        };
        Box::new(
            keys.take_while(|key| !filter.past_prefix(key))
                .filter(|key| {
                    filter
                        .prefix
                        .as_deref()
                        .is_none_or(|prefix| key.as_str().starts_with(prefix))
                }),
        )
    }
}

/// What is kept of an expired key.
#[derive(Clone, Debug)]
pub struct ExpiredRecord {
    pub service: ServiceId,
    pub meta: Option<Meta>,
    /// Unix ms (not registry-epoch ms: a record restored from the persistence log may predate
    /// this process).
    pub last_heartbeat_unix_ms: u64,
    /// Unix ms.
    pub expired_unix_ms: u64,
}

/// Recently expired keys, kept for a retention time and up to a count.
#[derive(Debug)]
pub(super) struct ExpiredLog {
    by_key: HashMap<Key, ExpiredRecord, foldhash::fast::RandomState>,
    /// Expiries oldest first (Unix ms). May hold entries whose key was re-registered or expired again
    /// since; those are skipped when they reach the front. Its length is what `max_len` bounds.
    order: VecDeque<(u64, Key)>,
    retention_ms: u64,
    max_len: usize,
    /// Records per service, for the services overview.
    by_service: HashMap<ServiceId, u32, foldhash::fast::RandomState>,
}

impl ExpiredLog {
    pub fn new(retention_ms: u64, max_len: usize) -> Self {
        Self {
            by_key: HashMap::default(),
            order: VecDeque::new(),
            retention_ms,
            max_len,
            by_service: HashMap::default(),
        }
    }

    pub fn record(&mut self, key: Key, record: ExpiredRecord) {
        if self.max_len == 0 {
            return;
        }
        let expired_ms = record.expired_unix_ms;
        *self.by_service.entry(record.service).or_default() += 1;
        if let Some(old) = self.by_key.insert(key.clone(), record) {
            self.uncount(old.service);
        }
        self.order.push_back((expired_ms, key));
        self.prune(expired_ms);
    }

    /// The record of `key`, if it is listed.
    pub fn get(&self, key: &Key) -> Option<&ExpiredRecord> {
        self.by_key.get(key)
    }

    /// Every listed record, in no particular order.
    pub fn records(&self) -> impl Iterator<Item = (&Key, &ExpiredRecord)> {
        self.by_key.iter()
    }

    /// Forgets `key` (it was registered again).
    pub fn forget(&mut self, key: &Key) {
        if let Some(old) = self.by_key.remove(key) {
            self.uncount(old.service);
        }
    }

    /// Drops records older than the retention time, and the oldest past the count bound.
    /// `now_ms` is Unix ms, like the records' times.
    pub fn prune(&mut self, now_ms: u64) {
        while let Some((expired_ms, _)) = self.order.front() {
            let too_old = expired_ms.saturating_add(self.retention_ms) <= now_ms;
            if !too_old && self.order.len() <= self.max_len {
                break;
            }
            let (expired_ms, key) = self.order.pop_front().expect("front exists");
            if self
                .by_key
                .get(&key)
                .is_some_and(|record| record.expired_unix_ms == expired_ms)
            {
                let record = self.by_key.remove(&key).expect("present");
                self.uncount(record.service);
            }
        }
    }

    /// Records per service, for every service that has some.
    pub fn counts(&self) -> impl Iterator<Item = (ServiceId, u32)> + '_ {
        self.by_service
            .iter()
            .map(|(&service, &count)| (service, count))
    }

    /// The first `limit` records matching `filter`, in key order.
    pub fn page(&self, filter: &ListFilter, limit: usize) -> Vec<(&Key, &ExpiredRecord)> {
        let after = filter.after.as_deref();
        let prefix = filter.prefix.as_deref().unwrap_or("");
        let mut matching: Vec<(&Key, &ExpiredRecord)> = self
            .by_key
            .iter()
            .filter(|(key, record)| {
                after.is_none_or(|after| key.as_str() > after)
                    && key.as_str().starts_with(prefix)
                    && filter
                        .service
                        .is_none_or(|service| record.service == service)
            })
            .collect();
        if matching.len() > limit && limit > 0 {
            matching.select_nth_unstable_by(limit - 1, |a, b| a.0.cmp(b.0));
        }
        matching.truncate(limit);
        matching.sort_unstable_by(|a, b| a.0.cmp(b.0));
        matching
    }

    /// Checks the log's own invariants and that no key listed here is alive (`is_alive`);
    /// panics naming the first one broken. O(records): for tests.
    pub fn check_invariants(&self, is_alive: impl Fn(&Key) -> bool) {
        assert!(
            self.order.len() <= self.max_len,
            "the expired log holds {} expiries, over its bound of {}",
            self.order.len(),
            self.max_len
        );
        let in_order: std::collections::HashSet<(u64, &Key)> =
            self.order.iter().map(|(at, key)| (*at, key)).collect();
        let mut counts: HashMap<ServiceId, u32> = HashMap::new();
        for (key, record) in &self.by_key {
            assert!(!is_alive(key), "{key} is both alive and listed as expired");
            assert!(
                in_order.contains(&(record.expired_unix_ms, key)),
                "{key}'s expiry is not in the age order, so it would never be pruned"
            );
            *counts.entry(record.service).or_default() += 1;
        }
        let kept: HashMap<ServiceId, u32> = self.counts().collect();
        assert_eq!(kept, counts, "the expired log's per-service counts");
    }

    fn uncount(&mut self, service: ServiceId) {
        if let Some(count) = self.by_service.get_mut(&service) {
            *count -= 1;
            if *count == 0 {
                self.by_service.remove(&service);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(index: &OrderedIndex, filter: &ListFilter) -> Vec<String> {
        index.scan(filter).map(|key| key.to_string()).collect()
    }

    #[test]
    fn scans_respect_prefix_cursor_and_service() {
        let mut index = OrderedIndex::default();
        let web = ServiceId::default();
        for key in ["a", "ab", "abc", "b", "ba"] {
            index.insert(&Key::new(key).unwrap(), web);
        }
        let filter = |prefix: Option<&str>, after: Option<&str>| ListFilter {
            service: None,
            prefix: prefix.map(String::from),
            after: after.map(String::from),
            held_only: false,
        };
        assert_eq!(
            keys(&index, &filter(None, None)),
            ["a", "ab", "abc", "b", "ba"]
        );
        assert_eq!(keys(&index, &filter(Some("a"), None)), ["a", "ab", "abc"]);
        assert_eq!(keys(&index, &filter(Some("a"), Some("ab"))), ["abc"]);
        assert_eq!(keys(&index, &filter(Some("b"), Some("a"))), ["b", "ba"]);
        assert_eq!(keys(&index, &filter(None, Some("b"))), ["ba"]);
        assert_eq!(keys(&index, &filter(Some("c"), None)), Vec::<String>::new());
    }

    #[test]
    fn expired_log_prunes_by_age_and_count() {
        let mut log = ExpiredLog::new(1_000, 2);
        let record = |expired_ms| ExpiredRecord {
            service: ServiceId::NONE,
            meta: None,
            last_heartbeat_unix_ms: 0,
            expired_unix_ms: expired_ms,
        };
        log.record(Key::new("a").unwrap(), record(10));
        log.record(Key::new("b").unwrap(), record(20));
        log.record(Key::new("c").unwrap(), record(30));
        let listed = |log: &ExpiredLog| {
            log.page(&ListFilter::default(), 10)
                .into_iter()
                .map(|(key, _)| key.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(listed(&log), ["b", "c"], "count bound drops the oldest");
        log.prune(1_020);
        assert_eq!(listed(&log), ["c"], "b is 1 s old at 1020");
        log.forget(&Key::new("c").unwrap());
        assert_eq!(listed(&log), Vec::<String>::new());
        assert_eq!(log.counts().count(), 0);
    }
}
