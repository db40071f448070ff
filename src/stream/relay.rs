//! Wakes a serving thread's stream readers from that thread, not from the feed's.
//!
//! The feed ([`super::feed`]) runs on the main runtime; the readers run on the serving threads,
//! each a current-thread runtime (`placement`). A reader that waits on the hub's `latest`
//! itself is woken from the feed's thread, and tokio queues a task woken from outside its
//! runtime by writing that runtime's eventfd: one system call per reader per wake-up. Measured
//! (1,000 reading clients, 100 events/s, `perf stat`): 1.03M `write`s to the serving threads'
//! eventfds beside the 0.99M `writev`s of the events, ~4 % of the server's samples (`perf
//! record`). With the relay the server used 3 % less CPU at 100 events/s and 7 % less at 300
//! (BENCHMARKS.md, eighteenth session).
//!
//! So each serving thread with readers has one relay: a task that waits on the hub's `latest`
//! (one cross-thread wake-up per thread) and passes each new value on to the thread's readers,
//! from the thread itself, where waking a task is a push onto the local queue.
//!
//! The relay tells readers in groups of [`GROUP`] and yields between groups. A yielding task
//! runs again after the runtime has polled its driver, so requests that arrived meanwhile are
//! queued before the next group instead of behind every reader on the thread.
//!
//! Invariants:
//! - A reader's receiver changes after every change of the hub's `latest` that follows its
//!   subscription (it may skip values, never the last): the relay reads each value and passes
//!   it to every group, and a new group starts at the value the relay last passed on.
//! - A relay lives only while readers subscribed through it are on its thread: a pass that
//!   finds none ends it, in one step with no await, so no reader can subscribe in between. A
//!   server without stream clients has no relay to wake.
//! - Only on current-thread runtimes, where every task runs on the thread that subscribed
//!   (the thread-local below is that runtime's). Elsewhere readers wait on the hub directly.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::watch;

use super::EventHub;

/// Readers told between two yields of a relay: ~32 writes of a few microseconds each, so a
/// request waits ~0.1 ms at most behind them.
pub const GROUP: usize = 32;

thread_local! {
    /// This thread's relays, one per hub (a process has one; tests run several servers).
    static RELAYS: RefCell<Vec<(Weak<EventHub>, Weak<Groups>)>> = const { RefCell::new(Vec::new()) };
}

/// A relay's readers, in groups of at most [`GROUP`].
#[derive(Debug)]
struct Groups {
    /// Each group's channel; its value is the hub's `latest` as last passed on.
    senders: Mutex<Vec<watch::Sender<u64>>>,
    /// The value last passed on to every group, where a new group starts.
    passed: AtomicU64,
}

impl Groups {
    /// A receiver in the first group with room, or in a new one.
    fn join(&self) -> watch::Receiver<u64> {
        let mut senders = self.senders.lock();
        if let Some(group) = senders.iter().find(|group| group.receiver_count() < GROUP) {
            return group.subscribe();
        }
        let (sender, receiver) = watch::channel(self.passed.load(Ordering::Relaxed));
        senders.push(sender);
        receiver
    }

    /// Passes `latest` on to group `index`: how many readers it holds, or `None` past the last.
    fn tell(&self, index: usize, latest: u64) -> Option<usize> {
        let senders = self.senders.lock();
        let group = senders.get(index)?;
        group.send_if_modified(|value| std::mem::replace(value, latest) != latest);
        Some(group.receiver_count())
    }
}

/// A receiver of the hub's `latest` for a reader on the current thread: through the thread's
/// relay (started if there is none) on a current-thread runtime, the hub's own elsewhere.
pub fn subscribe(hub: &Arc<EventHub>) -> watch::Receiver<u64> {
    let own_thread = Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() == RuntimeFlavor::CurrentThread);
    if !own_thread {
        return hub.subscribe_latest();
    }
    relay_for(hub).join()
}

/// The current thread's relay for `hub`, started if there is none. Call on a current-thread
/// runtime.
fn relay_for(hub: &Arc<EventHub>) -> Arc<Groups> {
    RELAYS.with_borrow_mut(|relays| {
        relays.retain(|(hub, groups)| hub.strong_count() > 0 && groups.strong_count() > 0);
        let existing = relays
            .iter()
            .find(|(of, _)| std::ptr::eq(of.as_ptr(), Arc::as_ptr(hub)))
            .and_then(|(_, groups)| groups.upgrade());
        existing.unwrap_or_else(|| {
            let upstream = hub.subscribe_latest();
            let groups = Arc::new(Groups {
                senders: Mutex::default(),
                passed: AtomicU64::new(*upstream.borrow()),
            });
            tokio::spawn(relay(upstream, Arc::clone(&groups)));
            relays.push((Arc::downgrade(hub), Arc::downgrade(&groups)));
            groups
        })
    })
}

/// Passes each change of `upstream` on to every group, yielding after each group with readers;
/// ends when the hub goes or a pass finds no reader.
async fn relay(mut upstream: watch::Receiver<u64>, groups: Arc<Groups>) {
    while upstream.changed().await.is_ok() {
        let latest = *upstream.borrow_and_update();
        groups.passed.store(latest, Ordering::Relaxed);
        let mut readers = 0;
        let mut index = 0;
        while let Some(in_group) = groups.tell(index, latest) {
            index += 1;
            readers += in_group;
            if in_group > 0 {
                tokio::task::yield_now().await;
            }
        }
        if readers == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn hub() -> Arc<EventHub> {
        Arc::new(EventHub::new(16, usize::MAX))
    }

    /// Sets the hub's `latest` as the feed's wake-up does.
    fn announce(hub: &EventHub, value: u64) {
        hub.latest.send_replace(value);
    }

    /// Lets the relay (and whatever it woke) run until nothing is left to do.
    async fn settle() {
        for _ in 0..(4 * GROUP) {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn every_reader_sees_every_announcement_through_one_relay() {
        let hub = hub();
        let mut readers: Vec<_> = (0..3 * GROUP + 1).map(|_| subscribe(&hub)).collect();
        // One relay: one receiver on the hub's channel, whatever the number of readers.
        assert_eq!(hub.latest.receiver_count(), 1);
        assert!(!readers[0].same_channel(&hub.subscribe_latest()));
        for value in 1..=3 {
            announce(&hub, value);
            settle().await;
            for reader in &mut readers {
                assert!(reader.has_changed().unwrap(), "value {value}");
                assert_eq!(*reader.borrow_and_update(), value);
            }
        }
    }

    #[tokio::test]
    async fn a_reader_that_joins_later_is_woken_by_the_next_announcement() {
        let hub = hub();
        let _first = subscribe(&hub);
        announce(&hub, 7);
        settle().await;
        let mut late = subscribe(&hub);
        assert!(!late.has_changed().unwrap());
        announce(&hub, 8);
        settle().await;
        assert_eq!(*late.borrow_and_update(), 8);
        // A group started after a pass starts at what was passed on.
        let mut groups: Vec<_> = (0..GROUP).map(|_| subscribe(&hub)).collect();
        assert!(groups
            .iter_mut()
            .all(|g| !g.has_changed().unwrap() && *g.borrow() == 8));
    }

    #[tokio::test]
    async fn the_relay_ends_when_its_readers_are_gone_and_a_new_one_starts() {
        let hub = hub();
        let reader = subscribe(&hub);
        assert_eq!(hub.latest.receiver_count(), 1);
        drop(reader);
        announce(&hub, 1);
        settle().await;
        // The pass found no reader: the relay is gone, and no longer listens to the hub.
        assert_eq!(hub.latest.receiver_count(), 0);
        let mut reader = subscribe(&hub);
        assert_eq!(hub.latest.receiver_count(), 1);
        announce(&hub, 2);
        settle().await;
        assert_eq!(*reader.borrow_and_update(), 2);
    }

    #[tokio::test]
    async fn the_relay_yields_between_groups() {
        let hub = hub();
        let mut readers: Vec<_> = (0..2 * GROUP).map(|_| subscribe(&hub)).collect();
        announce(&hub, 1);
        // The relay's first turn tells the first group, then yields before the second.
        tokio::task::yield_now().await;
        let told = |readers: &mut Vec<watch::Receiver<u64>>| {
            readers
                .iter_mut()
                .filter(|r| r.has_changed().unwrap())
                .count()
        };
        assert_eq!(told(&mut readers), GROUP);
        settle().await;
        assert_eq!(told(&mut readers), 2 * GROUP);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_multi_thread_runtime_readers_wait_on_the_hub() {
        let hub = hub();
        let mut reader = subscribe(&hub);
        assert!(reader.same_channel(&hub.subscribe_latest()));
        announce(&hub, 5);
        tokio::time::timeout(Duration::from_secs(5), reader.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*reader.borrow(), 5);
    }
}
