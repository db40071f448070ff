//! What a link does to its traffic: the faults, the per-direction state a test sets, and the
//! throttle's pacing. Pure: no sockets, no clock (the pacer is given `now`).
//!
//! Invariant of [`Faults`]: a link is cut in both directions or in neither. A TCP connection
//! cannot be closed one way only, so the setters only ever make both directions `Cut` together.

use std::num::NonZeroU64;
use std::time::Duration;

use tokio::time::Instant;

/// What a link does to the bytes and connections that cross it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Bytes are delivered as soon as they are read.
    Pass,
    /// Every open connection is reset at once (RST to both ends), and every new one is accepted
    /// and reset straight away: the peer is unreachable and says so.
    Cut,
    /// Bytes vanish: connections stay open, what is written is read by the proxy and dropped,
    /// and new connections are accepted but never reach the target. The partition where packets
    /// are lost without a word. A connection that lost bytes is reset when the blackhole lifts
    /// (TCP never delivers a stream with a hole in it).
    Blackhole,
    /// Bytes wait: the proxy stops reading, so they stay in the kernel's buffers and the writer
    /// eventually blocks; when the stall lifts they are all delivered, in order. The partition
    /// healed before TCP gave up (retransmission delivers what was sent during it).
    Stall,
    /// Each chunk is delivered this long after the proxy read it; order is preserved.
    Delay(Duration),
    /// At most this many bytes per second are delivered (paced in pieces of 20 ms' worth).
    Throttle {
        /// The rate; not zero (a link that delivers nothing is [`Fault::Stall`]).
        bytes_per_s: NonZeroU64,
    },
}

impl Fault {
    /// `Fault::Throttle` at `bytes_per_s`, or `None` for a rate of zero.
    pub fn throttle(bytes_per_s: u64) -> Option<Fault> {
        NonZeroU64::new(bytes_per_s).map(|bytes_per_s| Fault::Throttle { bytes_per_s })
    }

    /// Whether a TCP handshake could complete through a link doing this in one direction:
    /// a SYN or SYN-ACK that vanishes or waits holds the connection short of its target.
    fn blocks_handshake(self) -> bool {
        matches!(self, Fault::Blackhole | Fault::Stall)
    }
}

/// The two directions of a link, named by where the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the connecting side (the client of the link) to the target.
    ToTarget,
    /// From the target back to the connecting side.
    ToClient,
}

/// Why a fault could not be set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FaultError {
    /// `Cut` was asked for one direction only.
    #[error("a TCP connection cannot be cut in one direction only: use set(Fault::Cut), or Blackhole/Stall one way")]
    CutIsBothWays,
}

/// The state of a link: one fault per direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// What happens to bytes going to the target.
    pub to_target: Fault,
    /// What happens to bytes coming back from the target.
    pub to_client: Fault,
}

impl Faults {
    /// Both directions doing `fault`.
    pub fn both(fault: Fault) -> Faults {
        Faults {
            to_target: fault,
            to_client: fault,
        }
    }

    /// The fault of one direction.
    pub fn get(&self, direction: Direction) -> Fault {
        match direction {
            Direction::ToTarget => self.to_target,
            Direction::ToClient => self.to_client,
        }
    }

    /// These faults with `direction` doing `fault`; a cut link becomes whole again in the other
    /// direction (the invariant: cut both ways or neither).
    pub(crate) fn with_one_way(
        self,
        direction: Direction,
        fault: Fault,
    ) -> Result<Faults, FaultError> {
        if fault == Fault::Cut {
            return Err(FaultError::CutIsBothWays);
        }
        let mut next = if self.is_cut() {
            Faults::both(Fault::Pass)
        } else {
            self
        };
        match direction {
            Direction::ToTarget => next.to_target = fault,
            Direction::ToClient => next.to_client = fault,
        }
        Ok(next)
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.to_target == Fault::Cut
    }

    /// Whether a new connection's handshake could not complete now (see
    /// [`Fault::blocks_handshake`]): the proxy then holds it without connecting to the target.
    pub(crate) fn blocks_handshake(&self) -> bool {
        self.to_target.blocks_handshake() || self.to_client.blocks_handshake()
    }
}

/// The throttle's schedule: each piece is delivered when the link would have finished sending
/// it at `bytes_per_s`, after every piece before it. Pieces are 20 ms' worth of bytes (at least
/// one byte), so a slow link trickles rather than delivering a whole read at once.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// When the link has finished sending everything scheduled so far; `None` once the link
    /// was idle (a new burst starts from `now`).
    free_at: Option<Instant>,
}

/// Pieces per second of a throttled link (20 ms each).
const PIECES_PER_S: u64 = 50;

impl Pacer {
    /// The largest piece at `bytes_per_s`.
    pub(crate) fn piece_len(bytes_per_s: NonZeroU64) -> usize {
        usize::try_from((bytes_per_s.get() / PIECES_PER_S).max(1)).unwrap_or(usize::MAX)
    }

    /// When a piece of `len` bytes read at `now` is delivered.
    pub(crate) fn schedule(
        &mut self,
        now: Instant,
        len: usize,
        bytes_per_s: NonZeroU64,
    ) -> Instant {
        let start = self.free_at.map_or(now, |free_at| free_at.max(now));
        let nanos = u128::try_from(len).unwrap_or(u128::MAX) * 1_000_000_000
            / u128::from(bytes_per_s.get());
        let at = start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.free_at = Some(at);
        at
    }

    /// Forget the schedule (the link stopped throttling).
    pub(crate) fn reset(&mut self) {
        self.free_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(bytes_per_s: u64) -> NonZeroU64 {
        NonZeroU64::new(bytes_per_s).unwrap()
    }

    #[test]
    fn one_way_cut_is_refused() {
        let faults = Faults::both(Fault::Pass);
        assert_eq!(
            faults.with_one_way(Direction::ToClient, Fault::Cut),
            Err(FaultError::CutIsBothWays)
        );
    }

    #[test]
    fn one_way_fault_on_a_cut_link_leaves_the_other_direction_passing() {
        let faults = Faults::both(Fault::Cut)
            .with_one_way(Direction::ToClient, Fault::Blackhole)
            .unwrap();
        assert_eq!(faults.to_target, Fault::Pass);
        assert_eq!(faults.to_client, Fault::Blackhole);
        assert!(!faults.is_cut());
    }

    #[test]
    fn a_one_way_blackhole_or_stall_blocks_new_handshakes_and_delay_does_not() {
        let check = |direction, fault, blocks| {
            let faults = Faults::both(Fault::Pass)
                .with_one_way(direction, fault)
                .unwrap();
            assert_eq!(faults.blocks_handshake(), blocks, "{direction:?} {fault:?}");
        };
        check(Direction::ToTarget, Fault::Blackhole, true);
        check(Direction::ToClient, Fault::Blackhole, true);
        check(Direction::ToClient, Fault::Stall, true);
        check(
            Direction::ToTarget,
            Fault::Delay(Duration::from_secs(1)),
            false,
        );
        check(Direction::ToTarget, Fault::throttle(10).unwrap(), false);
        check(Direction::ToTarget, Fault::Pass, false);
    }

    #[test]
    fn throttle_of_zero_is_not_a_fault() {
        assert_eq!(Fault::throttle(0), None);
    }

    #[test]
    fn pieces_are_twenty_milliseconds_and_at_least_one_byte() {
        assert_eq!(Pacer::piece_len(rate(1_000)), 20);
        assert_eq!(Pacer::piece_len(rate(1)), 1);
        assert_eq!(Pacer::piece_len(rate(1_000_000)), 20_000);
    }

    #[test]
    fn pacer_delivers_each_piece_when_the_link_has_sent_it() {
        let t0 = Instant::now();
        let mut pacer = Pacer::default();
        // 1,000 B/s: 20 bytes take 20 ms, back to back.
        assert_eq!(
            pacer.schedule(t0, 20, rate(1_000)),
            t0 + Duration::from_millis(20)
        );
        assert_eq!(
            pacer.schedule(t0, 20, rate(1_000)),
            t0 + Duration::from_millis(40)
        );
        // Read later than the link was free: the piece starts when it was read.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            pacer.schedule(later, 10, rate(1_000)),
            later + Duration::from_millis(10)
        );
        pacer.reset();
        assert_eq!(
            pacer.schedule(t0, 5, rate(1_000)),
            t0 + Duration::from_millis(5)
        );
    }
}
