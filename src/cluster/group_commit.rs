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
//! Invariants: one proposal in flight at a time; an entry holds at most [`MAX_GROUP_RECORDS`]
//! records and [`MAX_ENTRY_BYTES`] of them; a request larger than either is split, in order,
//! into pieces that each fit, and no other piece is ever split; each piece's records stay
//! together and in order, pieces in arrival order; a request is answered once every piece of it
//! was applied (or with the first failure), with what applying each of its records did.
//!
//! Why split: openraft 0.9 sends an entry whole and gives an AppendEntries its heartbeat
//! interval (150 ms) before sending it again, forever: a 1 MiB batch request in one entry
//! (~1.3 MiB of base64 JSON) could never reach a follower over a link slower than ~9 MB/s,
//! and every write behind it waited. A batch's heartbeats are independent, so pieces in
//! separate entries change nothing they promise; a request answered with an error may have
//! had some pieces applied, as a timed-out one always may.

use tokio::sync::{mpsc, oneshot};

use super::node::{propose_to, ProposeError};
use super::types::{record_len, Applied, Command, TypeConfig, MAX_ENTRY_BYTES};
use crate::persist::record::Record;

/// The most records one gathered entry carries (a batch request is at most 1,000).
pub const MAX_GROUP_RECORDS: usize = 1024;

/// How many requests may wait for the next proposal; past it, a request waits for room.
const QUEUE: usize = 16 * 1024;

/// One piece of a request: its records, their size and where its outcome goes.
struct Waiting {
    records: Vec<Record>,
    bytes: usize,
    answer: oneshot::Sender<Result<Written, ProposeError>>,
}

/// Records committed and applied: the last entry that carried them, and which of them created
/// their key (only the apply can tell: see `Applied::created`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub log_index: u64,
    created: Vec<bool>,
}

impl Written {
    /// Whether the request's `i`-th record created its key when applied.
    pub fn created(&self, i: usize) -> bool {
        self.created.get(i).copied().unwrap_or(false)
    }

    /// What the records at `first..first + n` of the entry `applied` did.
    fn of(applied: &Applied, first: usize, n: usize) -> Self {
        Self {
            log_index: applied.log_index,
            created: (first..first + n)
                .map(|at| applied.created_at(at))
                .collect(),
        }
    }

    /// This piece's outcome followed by the next one's.
    fn then(mut self, next: Self) -> Self {
        self.log_index = next.log_index;
        self.created.extend(next.created);
        self
    }
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

    /// Proposes `records` in the next entry (or, if they do not fit in one, the next ones);
    /// what applying them did.
    pub async fn write(&self, records: Vec<Record>) -> Result<Written, ProposeError> {
        let stopped = || ProposeError::Stopped("the proposer has stopped".into());
        let mut outcomes = Vec::new();
        for (records, bytes) in pieces(records) {
            let (answer, outcome) = oneshot::channel();
            let waiting = Waiting {
                records,
                bytes,
                answer,
            };
            self.queue.send(waiting).await.map_err(|_| stopped())?;
            outcomes.push(outcome);
        }
        let mut written = Written::default();
        for outcome in outcomes {
            written = written.then(outcome.await.unwrap_or_else(|_| Err(stopped()))?);
        }
        Ok(written)
    }
}

/// `records` in pieces that each fit one entry, in order, each with its size (at least one
/// record a piece: a record is far smaller than an entry's cap).
fn pieces(records: Vec<Record>) -> Vec<(Vec<Record>, usize)> {
    let mut pieces: Vec<(Vec<Record>, usize)> = Vec::new();
    for record in records {
        let len = record_len(&record);
        match pieces.last_mut() {
            Some((piece, bytes))
                if piece.len() < MAX_GROUP_RECORDS && *bytes + len <= MAX_ENTRY_BYTES =>
            {
                piece.push(record);
                *bytes += len;
            }
            _ => pieces.push((vec![record], len)),
        }
    }
    pieces
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
            answers.push((records.len(), waiting.records.len(), waiting.answer));
            records.extend(waiting.records);
        }
        let outcome = propose_to(&raft, Command::Writes(records)).await;
        for (first, n, answer) in answers {
            let written = (outcome.as_ref())
                .map(|applied| Written::of(applied, first, n))
                .map_err(Clone::clone);
            // A caller that gave up (its request timed out) no longer listens.
            let _ = answer.send(written);
        }
    }
}

/// `first` and the pieces already waiting behind it, up to [`MAX_GROUP_RECORDS`] records and
/// [`MAX_ENTRY_BYTES`]; the piece that did not fit, if any, leads the next group.
fn gather(
    first: Waiting,
    waiting: &mut mpsc::Receiver<Waiting>,
) -> (Vec<Waiting>, Option<Waiting>) {
    let (mut records, mut bytes) = (first.records.len(), first.bytes);
    let mut group = vec![first];
    while records < MAX_GROUP_RECORDS {
        let Ok(next) = waiting.try_recv() else {
            break;
        };
        if records + next.records.len() > MAX_GROUP_RECORDS || bytes + next.bytes > MAX_ENTRY_BYTES
        {
            return (group, Some(next));
        }
        records += next.records.len();
        bytes += next.bytes;
        group.push(next);
    }
    (group, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::record::KeyState;
    use crate::persist::testing::record;
    use crate::types::Meta;

    fn waiting(
        records: Vec<Record>,
    ) -> (Waiting, oneshot::Receiver<Result<Written, ProposeError>>) {
        let (answer, outcome) = oneshot::channel();
        let bytes = records.iter().map(record_len).sum();
        let waiting = Waiting {
            records,
            bytes,
            answer,
        };
        (waiting, outcome)
    }

    fn small(n: usize) -> Vec<Record> {
        (0..n as u64).map(record).collect()
    }

    /// `n` records with metadata of about 4 KiB each (the API's most).
    fn fat(n: usize) -> Vec<Record> {
        let meta = Meta::from_value(&serde_json::json!({ "x": "m".repeat(4_000) })).unwrap();
        (0..n as u64)
            .map(|i| match record(i) {
                Record::Upsert(state) => Record::Upsert(KeyState {
                    meta: Some(meta.clone()),
                    ..state
                }),
                other => other,
            })
            .collect()
    }

    /// The groups `requests` are proposed in, as record counts.
    async fn groups_of(requests: Vec<Vec<Record>>) -> Vec<Vec<usize>> {
        let (queue, mut receiver) = mpsc::channel(64);
        for records in requests {
            queue.send(waiting(records).0).await.unwrap();
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
            assert!(group.iter().map(|w| w.bytes).sum::<usize>() <= MAX_ENTRY_BYTES);
            carried = next;
            groups.push(group.iter().map(|w| w.records.len()).collect::<Vec<_>>());
        }
        groups
    }

    /// Each request reads its own records' outcomes out of the shared entry's, and a split
    /// request its pieces' in order.
    #[test]
    fn a_request_reads_whether_its_records_created_keys_from_its_place_in_the_entries() {
        let mut applied = Applied {
            log_index: 9,
            n_records: 130,
            created: Vec::new(),
        };
        for position in [0, 63, 64, 129] {
            applied.mark_created(position);
        }
        let second = Written::of(&applied, 63, 67);
        let created: Vec<usize> = (0..67).filter(|&i| second.created(i)).collect();
        assert_eq!(created, [0, 1, 66]);
        let first = Written::of(&applied, 0, 2);
        assert!(first.created(0) && !first.created(1) && !first.created(200));
        let both = first.then(second);
        let created: Vec<usize> = (0..69).filter(|&i| both.created(i)).collect();
        assert_eq!(created, [0, 2, 3, 68]);
        assert_eq!(both.log_index, 9);
    }

    #[tokio::test]
    async fn requests_are_gathered_whole_in_order_up_to_the_caps() {
        let sizes = [1000, 20, 4, 1000, 3];
        let groups = groups_of(sizes.iter().map(|&n| small(n)).collect()).await;
        // 1,000 + 20 + 4 fit; the next 1,000 would not.
        assert_eq!(groups, [vec![1000, 20, 4], vec![1000, 3]]);
        assert_eq!(
            groups.concat(),
            sizes,
            "every request once, in arrival order"
        );
        // By bytes: 16 records of ~4 KiB fill an entry long before 1,024 records.
        let groups = groups_of(vec![fat(10), fat(10), small(5)]).await;
        assert_eq!(groups, [vec![10], vec![10, 5]]);
    }

    /// A request too large for one entry (1,000 heartbeats with 4 KiB of metadata each: the
    /// API's largest batch body, 4 MiB) is split into pieces that each fit, in order, every
    /// record once; one with more records than an entry holds, likewise.
    #[test]
    fn a_request_too_large_for_an_entry_is_split_in_order_into_pieces_that_fit() {
        for records in [fat(1000), small(2500)] {
            let keys = |records: &[Record]| -> Vec<String> {
                (records.iter())
                    .map(|record| match record {
                        Record::Upsert(state) => state.key.as_str().to_owned(),
                        other => panic!("{other:?}"),
                    })
                    .collect()
            };
            let all = keys(&records);
            let pieces = pieces(records);
            assert!(pieces.len() > 1);
            for (piece, bytes) in &pieces {
                assert_eq!(*bytes, piece.iter().map(record_len).sum::<usize>());
                assert!(*bytes <= MAX_ENTRY_BYTES && piece.len() <= MAX_GROUP_RECORDS);
            }
            let rejoined: Vec<String> = pieces.iter().flat_map(|(piece, _)| keys(piece)).collect();
            assert_eq!(rejoined, all);
        }
    }
}
