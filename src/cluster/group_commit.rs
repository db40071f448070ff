//! Group commit at the Raft level: the writes that arrive while a proposal is in flight go
//! into the next one, as one log entry (docs/cluster-design.md, section 3, "Writes are
//! batched by the proposer").
//!
//! Why: openraft 0.9's leader flushes each log entry on its own, one after another, so a
//! creation per entry is bounded by the disk's sync latency (measured: 538-3,774 creations/s
//! with 50 connections, against etcd's ~1,590 grant+put, `bench/cluster_vs_etcd.sh`).
//! Gathering them makes a sync cover every request that waited for it, as the single node's
//! journal does (`persist::journal`).
//!
//! Invariants: one proposal in flight at a time; a group holds at most [`MAX_GROUP_RECORDS`]
//! records, and a request is never split (a request larger than that goes alone); each
//! request's records stay together and in order, requests in arrival order; every request is
//! answered with the outcome of the entry that carried it.

use tokio::sync::{mpsc, oneshot};

use super::node::{propose_to, ProposeError};
use super::types::{Applied, Command, TypeConfig};
use crate::persist::record::Record;

/// The most records one gathered entry carries (a batch request is at most 1,000): it stays
/// well under the network's payload cap, so an entry never waits for a payload of its own.
pub const MAX_GROUP_RECORDS: usize = 1024;

/// How many requests may wait for the next proposal; past it, a request waits for room.
const QUEUE: usize = 16 * 1024;

/// One request's records and where its outcome goes.
struct Waiting {
    records: Vec<Record>,
    answer: oneshot::Sender<Result<Applied, ProposeError>>,
}

/// The proposer's door: see the module documentation.
#[derive(Clone, Debug)]
pub struct GroupCommit {
    queue: mpsc::Sender<Waiting>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("records", &self.records.len())
            .finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// Starts the proposer task over `raft`.
    pub fn start(raft: openraft::Raft<TypeConfig>) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let task = tokio::spawn(run(raft, waiting));
        (Self { queue }, task)
    }

    /// Proposes `records` in the next entry; the outcome of that entry.
    pub async fn write(&self, records: Vec<Record>) -> Result<Applied, ProposeError> {
        let (answer, outcome) = oneshot::channel();
        let waiting = Waiting { records, answer };
        if self.queue.send(waiting).await.is_err() {
            return Err(ProposeError::Stopped("the proposer has stopped".into()));
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(ProposeError::Stopped("the proposer has stopped".into())))
    }
}

/// Takes the requests waiting, proposes them as one entry, answers them; again.
async fn run(raft: openraft::Raft<TypeConfig>, mut waiting: mpsc::Receiver<Waiting>) {
    let mut carried: Option<Waiting> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match waiting.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let (group, next) = gather(first, &mut waiting);
        carried = next;
        let mut records = Vec::with_capacity(group.iter().map(|w| w.records.len()).sum());
        let mut answers = Vec::with_capacity(group.len());
        for waiting in group {
            records.extend(waiting.records);
            answers.push(waiting.answer);
        }
        let outcome = propose_to(&raft, Command::Writes(records)).await;
        for answer in answers {
            // A caller that gave up (its request timed out) no longer listens.
            let _ = answer.send(outcome.clone());
        }
    }
}

/// `first` and the requests already waiting behind it, up to [`MAX_GROUP_RECORDS`] records;
/// the request that did not fit, if any, leads the next group.
fn gather(
    first: Waiting,
    waiting: &mut mpsc::Receiver<Waiting>,
) -> (Vec<Waiting>, Option<Waiting>) {
    let mut records = first.records.len();
    let mut group = vec![first];
    while records < MAX_GROUP_RECORDS {
        let Ok(next) = waiting.try_recv() else {
            break;
        };
        if records + next.records.len() > MAX_GROUP_RECORDS {
            return (group, Some(next));
        }
        records += next.records.len();
        group.push(next);
    }
    (group, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::testing::record;

    fn waiting(n: usize) -> (Waiting, oneshot::Receiver<Result<Applied, ProposeError>>) {
        let (answer, outcome) = oneshot::channel();
        let records = (0..n as u64).map(record).collect();
        (Waiting { records, answer }, outcome)
    }

    #[tokio::test]
    async fn requests_are_gathered_whole_in_order_up_to_the_cap() {
        let (queue, mut receiver) = mpsc::channel(16);
        let mut sizes = Vec::new();
        for n in [1000, 20, 4, 1000, 2000, 3] {
            let (request, _outcome) = waiting(n);
            sizes.push(n);
            queue.send(request).await.unwrap();
        }
        let mut groups = Vec::new();
        let mut carried = None;
        loop {
            let first = match carried.take() {
                Some(first) => first,
                None => match receiver.try_recv() {
                    Ok(first) => first,
                    Err(_) => break,
                },
            };
            let (group, next) = gather(first, &mut receiver);
            carried = next;
            groups.push(group.iter().map(|w| w.records.len()).collect::<Vec<_>>());
        }
        // 1,000 + 20 + 4 fit; the next 1,000 would not; 2,000 goes alone, over the cap.
        assert_eq!(groups, [vec![1000, 20, 4], vec![1000], vec![2000], vec![3]]);
        let flat: Vec<usize> = groups.concat();
        assert_eq!(flat, sizes, "every request once, in arrival order");
    }
}
