//! A cluster member's event ids: each event's place in the Raft log, so that a client can
//! resume on any member with the id another gave it (`Last-Event-ID`).
//!
//! An event from a committed entry has the log id the state machine gave it (`n << 16 | i`:
//! the `i`-th event of entry `n`), the same on every member; ids are `log-<16 hex digits>`. An
//! event that no entry produced (the guard's, each member's own) takes the place just after the
//! event before it: `log-<that id>.<k>` for the `k`-th such event in a row. Places only grow
//! along the ring, so a place names a position in it: resuming after place `p` reads the events
//! whose place is above `p`.
//!
//! What a member can resume from: its ring holds every event of the entries it applied since
//! it loaded its newest snapshot (at start, or installed from the leader) minus what left the
//! ring. Below that, from [`LogIds::complete_from`] (the first entry after the snapshot) or the
//! newest place that left the ring, events may be missing: the client is told to re-read
//! the lists (`reset`). Above its newest event (a client coming from a member ahead of this
//! one) it reads on from its newest event and passes over those at or below `p` as they come.
//!
//! A snapshot installed while clients read (a member that fell behind the leader's log) skips
//! the events of every entry it covers: they were never published here. Each install leaves a
//! **mark** in the ring, just before the first event of an entry after the snapshot: a reader
//! reads up to the mark, is told to re-read the lists (`reset`), and reads on. The events of
//! entries before the snapshot were published before it was installed (the state machine
//! publishes as it applies, and installs on the same task), so they all precede the mark.
//!
//! Marks are numbered: a reader starts told of every mark placed when it connects, so a mark
//! at the very `seq` it started from still reaches it if the install came after it connected.
//! One that connects between an install and its mark is told once for nothing (it re-reads
//! lists it has just read), never not told.
//!
//! Invariants: `places` holds the place of every event of the ring, `first_seq` onwards, in
//! increasing order; `newest` is the last place given (or the zero place); `marks` do not
//! decrease and are the newest `marks.len()` of `marks_placed`, at most [`MAX_MARKS`].

use std::collections::VecDeque;

use tokio::sync::watch;

use crate::events::Event;

/// Snapshot marks kept: a reader more than this many installs behind has fallen out of the
/// ring long before (an install replaces all the state).
const MAX_MARKS: usize = 16;

/// An event's place in the log: its log id, and how many events no entry numbered came after
/// that one up to it (0 for an event with a log id).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub log_id: u64,
    pub local: u32,
}

impl Place {
    /// The SSE id.
    pub fn id(self) -> String {
        match self.local {
            0 => format!("log-{:016x}", self.log_id),
            local => format!("log-{:016x}.{local}", self.log_id),
        }
    }

    /// The place an SSE id names, if it is one of this form.
    pub fn parse(id: &str) -> Option<Self> {
        let rest = id.trim().strip_prefix("log-")?;
        let (hex, local) = match rest.split_once('.') {
            Some((hex, local)) => (hex, local.parse().ok().filter(|&local| local > 0)?),
            None => (rest, 0),
        };
        (hex.len() == 16).then_some(())?;
        Some(Self {
            log_id: u64::from_str_radix(hex, 16).ok()?,
            local,
        })
    }
}

/// Where a client resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// After ring `seq` (the seq of the last event at or below the client's place).
    After(u64),
    /// After the newest event, passing over events at or below the place as they come.
    Ahead { newest: u64, through: Place },
    /// Events after the place may be missing here.
    Gap,
}

/// See the module documentation.
#[derive(Debug)]
pub struct LogIds {
    places: VecDeque<Place>,
    /// The ring `seq` of `places[0]`.
    first_seq: u64,
    newest: Place,
    /// The newest place that left the ring.
    evicted: Option<Place>,
    /// The first log id this member has every event from (set by the state machine when it
    /// loads a snapshot: the entry after it, `index + 1 << 16`).
    complete_from: watch::Receiver<u64>,
    /// The `complete_from` the marks account for.
    marked_from: u64,
    /// A snapshot was installed and its mark is not placed yet.
    mark_due: bool,
    /// Ring `seq`s after which a snapshot was installed (see the module documentation), the
    /// newest [`MAX_MARKS`].
    marks: VecDeque<u64>,
    /// Marks ever placed.
    marks_placed: u64,
}

impl LogIds {
    pub fn new(complete_from: watch::Receiver<u64>) -> Self {
        let marked_from = *complete_from.borrow();
        Self {
            places: VecDeque::new(),
            first_seq: 1,
            newest: Place::default(),
            evicted: None,
            complete_from,
            marked_from,
            mark_due: false,
            marks: VecDeque::new(),
            marks_placed: 0,
        }
    }

    /// Gives `event` (ring `seq`, the next one) its place; places the mark of a snapshot
    /// installed before it.
    pub fn push(&mut self, seq: u64, event: &Event) {
        debug_assert_eq!(seq, self.first_seq + self.places.len() as u64);
        self.note_install();
        if self.mark_due
            && event
                .log_id
                .is_some_and(|log_id| log_id >= self.marked_from)
        {
            self.mark(seq - 1);
        }
        self.newest = match event.log_id {
            Some(log_id) => Place { log_id, local: 0 },
            None => Place {
                local: self.newest.local + 1,
                ..self.newest
            },
        };
        self.places.push_back(self.newest);
    }

    /// Places the mark of a snapshot installed since the last event, after ring `newest`: the
    /// feeder calls it once it has appended every event published before the install.
    pub fn mark_installed(&mut self, newest: u64) {
        self.note_install();
        if self.mark_due {
            self.mark(newest);
        }
    }

    /// How many marks were ever placed: a reader that connects now starts told of them all.
    pub fn marks_placed(&self) -> u64 {
        self.marks_placed
    }

    /// The first mark a reader told of `told` marks has not been told of: its number (what
    /// `told` becomes once it is) and the ring `seq` after which it stands.
    pub fn next_mark(&self, told: u64) -> Option<(u64, u64)> {
        let first_kept = self.marks_placed - self.marks.len() as u64;
        let index = told.saturating_sub(first_kept);
        let seq = *self.marks.get(usize::try_from(index).ok()?)?;
        Some((first_kept + index + 1, seq))
    }

    fn note_install(&mut self) {
        let complete_from = *self.complete_from.borrow();
        if complete_from != self.marked_from {
            self.marked_from = complete_from;
            self.mark_due = true;
        }
    }

    fn mark(&mut self, after: u64) {
        self.mark_due = false;
        self.marks.push_back(after);
        self.marks_placed += 1;
        if self.marks.len() > MAX_MARKS {
            self.marks.pop_front();
        }
    }

    /// Forgets the places of events before ring `first_seq` (they left the ring).
    pub fn trim(&mut self, first_seq: u64) {
        while self.first_seq < first_seq {
            match self.places.pop_front() {
                Some(place) => self.evicted = Some(place),
                None => break,
            }
            self.first_seq += 1;
        }
        self.first_seq = self.first_seq.max(first_seq);
    }

    /// The place of ring `seq`, if it is in the ring.
    pub fn place(&self, seq: u64) -> Option<Place> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.places.get(index).copied()
    }

    /// The SSE id of ring `seq` (a `reset`'s, after the newest, is the newest place's).
    pub fn id_of(&self, seq: u64) -> String {
        self.place(seq).unwrap_or(self.newest).id()
    }

    /// Where a client whose last event had place `after` resumes, the ring's newest being
    /// `newest`.
    pub fn resume(&self, after: Place, newest: u64) -> Resume {
        let complete_from = *self.complete_from.borrow();
        if after.log_id < complete_from || self.evicted.is_some_and(|gone| after < gone) {
            return Resume::Gap;
        }
        let above = self.places.partition_point(|&place| place <= after);
        if above == self.places.len() {
            return Resume::Ahead {
                newest,
                through: after,
            };
        }
        Resume::After(self.first_seq + above as u64 - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(log_id: Option<u64>) -> Event {
        Event {
            kind: crate::events::EventKind::Expired,
            key: crate::types::Key::new("k").unwrap(),
            service: None,
            meta: None,
            ttl_ms: None,
            registered_at_ms: 0,
            last_heartbeat_at_ms: 0,
            deadline_ms: None,
            occurred_at_ms: 0,
            lateness_ms: 0,
            restored: false,
            log_id,
        }
    }

    #[test]
    fn ids_read_back_and_other_forms_are_refused() {
        for place in [
            Place::default(),
            Place {
                log_id: 7 << 16 | 3,
                local: 0,
            },
            Place {
                log_id: u64::MAX,
                local: 2,
            },
        ] {
            assert_eq!(Place::parse(&place.id()), Some(place));
        }
        for bad in [
            "",
            "log-",
            "log-12",
            "log-00000000000000zz",
            "log-0000000000000001.0",
        ] {
            assert_eq!(Place::parse(bad), None, "{bad}");
        }
        assert_eq!(Place::parse("1a2b3c4d-17"), None, "a single node's id");
    }

    /// Must hold: a client resumes just after its place, on this member, whatever member gave
    /// it the id; below what this member holds whole it is told; ahead, it waits.
    #[test]
    fn a_place_resumes_after_itself_or_says_why_not() {
        let floor = watch::channel(5 << 16).0;
        let mut ids = LogIds::new(floor.subscribe());
        let logged = [5 << 16, 6 << 16, 6 << 16 | 1, 9 << 16];
        let mut seq = 0;
        for log_id in logged {
            seq += 1;
            ids.push(seq, &event(Some(log_id)));
        }
        seq += 1;
        ids.push(seq, &event(None)); // seq 5: a guard event after 9 << 16
        assert_eq!(ids.id_of(5), format!("log-{:016x}.1", 9 << 16));
        let at = |log_id, local| Place { log_id, local };
        assert_eq!(ids.resume(at(5 << 16, 0), 5), Resume::After(1));
        assert_eq!(ids.resume(at(6 << 16 | 1, 0), 5), Resume::After(3));
        // Entries 7 and 8 had no events: the client saw one of another member's, none here.
        assert_eq!(ids.resume(at(8 << 16, 0), 5), Resume::After(3));
        assert_eq!(ids.resume(at(9 << 16, 0), 5), Resume::After(4));
        assert_eq!(
            ids.resume(at(9 << 16, 1), 5),
            Resume::Ahead {
                newest: 5,
                through: at(9 << 16, 1)
            }
        );
        assert_eq!(
            ids.resume(at(12 << 16, 0), 5),
            Resume::Ahead {
                newest: 5,
                through: at(12 << 16, 0)
            }
        );
        // Before the snapshot this member loaded, and before what left the ring: a gap.
        assert_eq!(ids.resume(at(4 << 16 | 9, 0), 5), Resume::Gap);
        ids.trim(3);
        assert_eq!(ids.place(2), None);
        assert_eq!(ids.resume(at(5 << 16, 0), 5), Resume::Gap);
        assert_eq!(ids.resume(at(6 << 16, 0), 5), Resume::After(2));
        floor.send_replace(10 << 16); // a snapshot installed
        assert_eq!(ids.resume(at(9 << 16, 1), 5), Resume::Gap);
    }

    /// Must hold: a snapshot installed while events flow leaves its mark just before the first
    /// event of an entry after it, however the events before it were batched; right after the
    /// newest event when none comes after it; and a reader that connected before an install
    /// is told of it even when the mark stands where it started.
    #[test]
    fn an_installed_snapshot_marks_the_ring_where_its_entries_would_have_been() {
        let floor = watch::channel(0).0;
        let mut ids = LogIds::new(floor.subscribe());
        let early_reader = ids.marks_placed(); // connected at seq 0
        ids.push(1, &event(Some(3 << 16)));
        floor.send_replace(10 << 16); // entries up to 9 come in a snapshot
        ids.push(2, &event(Some(4 << 16))); // published before the install
        ids.push(3, &event(None)); // a guard event
        assert_eq!(ids.next_mark(early_reader), None, "no event after it yet");
        ids.push(4, &event(Some(10 << 16)));
        ids.push(5, &event(Some(11 << 16)));
        assert_eq!(ids.next_mark(early_reader), Some((1, 3)));
        assert_eq!(ids.next_mark(1), None, "a reader told of it reads on");
        ids.mark_installed(5);
        assert_eq!(ids.next_mark(1), None, "one install, one mark");
        let late_reader = ids.marks_placed();
        assert_eq!(ids.next_mark(late_reader), None);

        floor.send_replace(20 << 16); // another, with no event after it
        ids.mark_installed(5);
        assert_eq!(ids.next_mark(1), Some((2, 5)));
        assert_eq!(
            ids.next_mark(late_reader),
            Some((2, 5)),
            "connected at 5, before it"
        );
        ids.push(6, &event(Some(20 << 16)));
        assert_eq!(ids.next_mark(2), None);

        // Past the bound, the oldest marks go; a reader that far behind reads the oldest kept.
        for n in 0..MAX_MARKS as u64 + 3 {
            floor.send_replace((30 + n) << 16);
            ids.mark_installed(6);
        }
        assert_eq!(ids.marks.len(), MAX_MARKS);
        let placed = ids.marks_placed();
        assert_eq!(ids.next_mark(0), Some((placed - MAX_MARKS as u64 + 1, 6)));
        assert_eq!(ids.next_mark(placed), None);
    }
}
