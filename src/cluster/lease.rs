//! The lease rules of a cluster node: when a leader checkpoints renewals, when a new leader may
//! start counting deadlines (promotion), when a leader may act on its leases at all (fencing),
//! and what losing leadership stops (demotion). `docs/cluster-design.md`, section 6.
//!
//! One place for them, as etcd's lessor is (`Promote`, `Demote`, `Checkpoint` in
//! `server/lease/lessor.go`), rather than spread over request handlers: the glue
//! (`cluster/node.rs`, to come) tells a [`Lease`] what Raft reports and what time it is, and
//! carries out the [`Action`]s it answers, in order.
//!
//! # The rules
//! 1. **Checkpoints**: while promoted, one [`Action::ProposeCheckpoint`] per
//!    `checkpoint_interval` (the keys renewed since the last one and their remaining time; the
//!    registry keeps that dirty set). The interval counts from the promotion, then from each
//!    checkpoint: a late tick proposes one checkpoint, not the ones it missed, so two are never
//!    closer than the interval. A promoted leader keeps checkpointing while fenced: what it
//!    renewed before the fence should reach the log if the link heals.
//! 2. **Promotion**: a leader is promoted when the blank entry of its own term is applied (etcd
//!    promotes at the first entry of the term, `server.go`): everything committed before its term
//!    is then applied here. [`Action::Promote`] tells the glue to give every key
//!    [`failover_deadline`]`(at, r, ttl, failover_grace) = at + max(r, min(ttl, grace))`, where `r`
//!    is the key's remaining time as of `last_leader_contact`. The blank may be applied before
//!    the metrics show this node as leader of that term; the term is remembered, so the
//!    promotion then happens as soon as they do (one leader per term: a blank of term `T`
//!    applied here and this node leading `T` means the blank is its own).
//! 3. **Fencing**: [`Lease::may_serve`] (renewals, expiry proposals, linearizable reads) holds
//!    only while the node leads, is promoted in its current term, and `now < quorum_ack + fence`.
//!    `quorum_ack` is the *earlier* of two estimates of the newest send instant a quorum
//!    acknowledged, and is unknown (no serving) until both exist:
//!    - from `RaftMetrics`: `now - millis_since_quorum_ack`, replaced at every reading (a
//!      reading only errs fresh: the watch channel may deliver it late, so keeping the maximum
//!      would keep the most inflated one);
//!    - from our network: the send instant of the newest request a quorum acknowledged in the
//!      current term (stamped before sending, so it only errs early); monotonic within a term.
//!
//!    `fence = 0.8 x election_timeout_min` by default ([`default_fence`]): a follower that
//!    acknowledged a request sent at `t` refuses votes until `t + election_timeout_max`, so no
//!    other leader exists before then; stopping at `t + fence` leaves the rest for clock-rate
//!    drift and scheduling.
//! 4. **Demotion**: leaving leadership (another role, or a newer term) pauses expiry and answers
//!    [`Action::Demote`] (stop the sweeper and the checkpoints, clear the dirty set, forward from
//!    now on); every leader state (acks, promotion, the checkpoint schedule) goes with it. A new
//!    leadership starts unpromoted, whatever the last one was.
//! 5. **Expiry** runs exactly while [`Lease::may_serve`] holds: [`Action::ResumeExpiry`] when it
//!    starts to hold (after the promotion, or an acknowledgment that lifts the fence),
//!    [`Action::PauseExpiry`] when it stops (the fence runs out, seen at the next call: the glue
//!    calls [`Lease::on_tick`] at [`Lease::next_deadline`]; demotion). Between two calls the time
//!    can pass the fence, so the sweeper also asks [`Lease::may_serve`] before each proposal.
//!
//! The last contact with a leader (`last_leader_contact`, the `since` of a promotion) is the
//! newest AppendEntries this node accepted while not leading; at a demotion, the demotion
//! itself (this node was the last leader it knew, counting until then); before either, the
//! instant the lease was created: a node that has heard from no leader cannot know how long the
//! old one kept counting, so it counts nothing (no false expirations first).
//!
//! # Bounds this gives
//! - **No false expiration across a leader kill**: a key renewed every TTL/3 has, at its last
//!   checkpoint, `r >= ttl - ttl/3 - checkpoint_interval`; the new leader cannot promote earlier
//!   than `election_timeout_min` after the old one's last heartbeat, which is later than the last
//!   acknowledged renewal. With `checkpoint_interval + commit latency < election_timeout_min`
//!   (hence [`LeaseConfig::validate`] refuses an interval above `election_timeout_min / 2`),
//!   `p + r` is after the deadline the old leader had given.
//! - **A dead client's key expires no later than** `max(D + (p - c), p + min(ttl, g)) + 1 s`,
//!   where `D` is its last checkpointed deadline, `c` the checkpoint, `p` the promotion, `g` the
//!   failover grace, and `1 s` the sweep's slack on a loaded machine. This is the issue's
//!   `D + grace + 1 s` whenever the failover after the checkpoint (`p - c`) is at most `g` and
//!   the key was not due more than 1 s before promotion.
//! - **Flagged disagreement with the issue**: a key that fell due *during* the election gets
//!   `min(ttl, g)` from promotion, up to `p - D - 1 s` past the expiry bound `D + g + 1 s`.
//!   Capping at `D + g` would meet that bound literally but could expire a live key whose
//!   renewals failed during a long election; we keep the failover rule (no false
//!   expirations first) and the difference is flagged to the owner.
//!
//! # What it deliberately does not do
//! No I/O, no clock (every instant is an argument), no Raft types (roles and terms come in as
//! plain values, [`MetricsView`]), no keys: the dirty set, the promotion pass over the shards
//! and the sweeper belong to the registry and the glue; this module only says when. It does not
//! compute the network's quorum acknowledgment (which needs the membership; `cluster/network.rs`
//! does, and hands in the result), and it does not step a fenced leader down: openraft 0.9 does
//! not, and the fence is what makes such a leader harmless.

use std::time::Duration;

use tokio::time::Instant;

/// The default `--checkpoint-interval`: the "<= 250 ms".
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// The default `--failover-grace`: a second above a loaded machine's failover (which the SIGSTOP
/// and kill tests measure), design section 6.
pub const DEFAULT_FAILOVER_GRACE: Duration = Duration::from_secs(5);

/// How far past every reachable deadline a saturated [`failover_deadline`] lies: tokio's own
/// "far future" (about 30 years). Only a duration that is no key's remaining time gets it.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The fence for an `election_timeout_min`: 4/5 of it (design section 6; 800 ms for etcd's
/// 1 s). The rest of the election timeout, and all of `election_timeout_max - fence`, is the
/// margin for clock-rate drift and a late turn of our own tasks.
pub fn default_fence(election_timeout_min: Duration) -> Duration {
    election_timeout_min * 4 / 5
}

/// The deadline a new leader gives a key at its promotion (the failover rule):
/// `promoted_at + max(remaining, min(ttl, grace))`.
///
/// `remaining` is the key's time left as of this node's last contact with the previous leader:
/// the old leader's promise is kept whole, and a key that fell due during the election gets
/// `min(ttl, grace)` for its client to find the new leader. Past [`FAR_FUTURE`] it saturates
/// rather than overflow (no key's remaining time is that long: TTLs stop at a year).
pub fn failover_deadline(
    promoted_at: Instant,
    remaining: Duration,
    ttl: Duration,
    grace: Duration,
) -> Instant {
    let extension = remaining.max(ttl.min(grace)).min(FAR_FUTURE);
    promoted_at + extension
}

/// The lease settings as given: two flags, openraft's election timeouts, and the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// `--checkpoint-interval`: how often a promoted leader checkpoints renewals.
    pub checkpoint_interval: Duration,
    /// `--failover-grace`: the least a new leader gives a key that fell due during the election
    /// (capped by the key's TTL).
    pub failover_grace: Duration,
    /// openraft's `election_timeout_min`: no follower starts an election sooner after its last
    /// heartbeat.
    pub election_timeout_min: Duration,
    /// openraft's `election_timeout_max`, also 0.9's leader lease: a follower refuses votes
    /// until this long after the last request it acknowledged.
    pub election_timeout_max: Duration,
    /// How long after its quorum acknowledgment a leader may serve; [`default_fence`] of
    /// `election_timeout_min` unless a test sets it.
    pub fence: Duration,
}

impl LeaseConfig {
    /// The flags' values with openraft's timeouts, and the default fence.
    pub fn new(
        checkpoint_interval: Duration,
        failover_grace: Duration,
        election_timeout_min: Duration,
        election_timeout_max: Duration,
    ) -> Self {
        Self {
            checkpoint_interval,
            failover_grace,
            election_timeout_min,
            election_timeout_max,
            fence: default_fence(election_timeout_min),
        }
    }

    /// The start-up check: the rules these settings give, or why they would break a bound of
    /// the module documentation.
    pub fn validate(&self) -> Result<LeaseRules, LeaseConfigError> {
        let min = self.election_timeout_min;
        let max = self.election_timeout_max;
        if min.is_zero() || min > max {
            return Err(LeaseConfigError::ElectionTimeouts { min, max });
        }
        if self.checkpoint_interval.is_zero() {
            return Err(LeaseConfigError::CheckpointIntervalZero);
        }
        if self.checkpoint_interval > min / 2 {
            return Err(LeaseConfigError::CheckpointIntervalTooLong {
                interval: self.checkpoint_interval,
                limit: min / 2,
                election_timeout_min: min,
            });
        }
        if self.failover_grace < max {
            return Err(LeaseConfigError::FailoverGraceTooShort {
                grace: self.failover_grace,
                election_timeout_max: max,
            });
        }
        if self.fence.is_zero() || self.fence >= min {
            return Err(LeaseConfigError::Fence {
                fence: self.fence,
                election_timeout_min: min,
            });
        }
        Ok(LeaseRules {
            checkpoint_interval: self.checkpoint_interval,
            failover_grace: self.failover_grace,
            fence: self.fence,
        })
    }
}

/// Settings a cluster node refuses to start with (the `--checkpoint-interval` and
/// `--failover-grace` flags, and openraft's timeouts they are checked against).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    #[error(
        "the election timeout must be above zero and its minimum at most its maximum \
         (min {min:?}, max {max:?})"
    )]
    ElectionTimeouts { min: Duration, max: Duration },
    #[error("--checkpoint-interval must be above zero")]
    CheckpointIntervalZero,
    #[error(
        "--checkpoint-interval {interval:?} is above {limit:?}, half the election timeout's \
         minimum ({election_timeout_min:?}): a checkpoint and its commit must land before a new \
         leader can be elected, or a failover could expire keys whose renewals it never saw"
    )]
    CheckpointIntervalTooLong {
        interval: Duration,
        limit: Duration,
        election_timeout_min: Duration,
    },
    #[error(
        "--failover-grace {grace:?} is shorter than the election timeout's maximum \
         ({election_timeout_max:?}): a key that fell due during an election would expire before \
         its client had one election's time to find the new leader"
    )]
    FailoverGraceTooShort {
        grace: Duration,
        election_timeout_max: Duration,
    },
    #[error(
        "the fence {fence:?} must be above zero and below the election timeout's minimum \
         ({election_timeout_min:?}): past it, a leader cut off from its quorum could still act \
         while another is elected"
    )]
    Fence {
        fence: Duration,
        election_timeout_min: Duration,
    },
}

/// Validated lease settings: only [`LeaseConfig::validate`] makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRules {
    /// At most `election_timeout_min / 2`, above zero.
    checkpoint_interval: Duration,
    /// At least `election_timeout_max`.
    failover_grace: Duration,
    /// Above zero, below `election_timeout_min`.
    fence: Duration,
}

impl LeaseRules {
    pub fn checkpoint_interval(&self) -> Duration {
        self.checkpoint_interval
    }

    pub fn failover_grace(&self) -> Duration {
        self.failover_grace
    }

    pub fn fence(&self) -> Duration {
        self.fence
    }

    /// [`failover_deadline`] with this node's grace.
    pub fn failover_deadline(
        &self,
        promoted_at: Instant,
        remaining: Duration,
        ttl: Duration,
    ) -> Instant {
        failover_deadline(promoted_at, remaining, ttl, self.failover_grace)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The design's values: 250 ms checkpoints, 5 s grace, elections between 1 s and 2 s.
    fn config() -> LeaseConfig {
        LeaseConfig::new(
            DEFAULT_CHECKPOINT_INTERVAL,
            DEFAULT_FAILOVER_GRACE,
            ms(1000),
            ms(2000),
        )
    }

    /// Validates `config` and compares the outcome, and an error's message, with `expected`.
    fn check_config(config: LeaseConfig, expected: Result<(), LeaseConfigError>, says: &str) {
        let outcome = config.validate();
        assert_eq!(
            outcome.as_ref().map(|_| ()),
            expected.as_ref().map(|_| ()),
            "{config:?}"
        );
        if let Err(error) = outcome {
            let message = error.to_string();
            assert!(message.contains(says), "{message:?} should say {says:?}");
        }
    }

    #[test]
    fn the_design_defaults_are_accepted_with_a_fence_of_four_fifths() {
        let rules = config().validate().unwrap();
        assert_eq!(rules.checkpoint_interval(), ms(250));
        assert_eq!(rules.failover_grace(), ms(5000));
        assert_eq!(rules.fence(), ms(800));
    }

    #[test]
    fn settings_that_break_a_bound_are_refused_with_the_flag_named() {
        let interval = |n| LeaseConfig {
            checkpoint_interval: ms(n),
            ..config()
        };
        let grace = |n| LeaseConfig {
            failover_grace: ms(n),
            ..config()
        };
        let fence = |n| LeaseConfig {
            fence: ms(n),
            ..config()
        };
        let timeouts = |min, max| LeaseConfig::new(ms(250), ms(5000), ms(min), ms(max));
        check_config(interval(500), Ok(()), "");
        check_config(
            interval(501),
            Err(LeaseConfigError::CheckpointIntervalTooLong {
                interval: ms(501),
                limit: ms(500),
                election_timeout_min: ms(1000),
            }),
            "--checkpoint-interval 501ms is above 500ms",
        );
        check_config(
            interval(0),
            Err(LeaseConfigError::CheckpointIntervalZero),
            "--checkpoint-interval",
        );
        check_config(grace(2000), Ok(()), "");
        check_config(
            grace(1999),
            Err(LeaseConfigError::FailoverGraceTooShort {
                grace: ms(1999),
                election_timeout_max: ms(2000),
            }),
            "--failover-grace 1.999s is shorter",
        );
        check_config(fence(999), Ok(()), "");
        check_config(
            fence(1000),
            Err(LeaseConfigError::Fence {
                fence: ms(1000),
                election_timeout_min: ms(1000),
            }),
            "the fence 1s must be",
        );
        check_config(
            fence(0),
            Err(LeaseConfigError::Fence {
                fence: ms(0),
                election_timeout_min: ms(1000),
            }),
            "above zero",
        );
        check_config(
            timeouts(2001, 2000),
            Err(LeaseConfigError::ElectionTimeouts {
                min: ms(2001),
                max: ms(2000),
            }),
            "at most its maximum",
        );
        check_config(
            timeouts(0, 0),
            Err(LeaseConfigError::ElectionTimeouts {
                min: ms(0),
                max: ms(0),
            }),
            "above zero",
        );
    }

    #[test]
    fn the_failover_rule_keeps_the_old_promise_or_gives_the_grace_capped_by_the_ttl() {
        let p = Instant::now();
        let g = ms(5000);
        // (remaining, ttl, extension from p)
        let cases = [
            (7000, 10_000, 7000), // the old leader's promise is longer than the grace
            (1000, 10_000, 5000), // due soon: the grace
            (0, 10_000, 5000),    // fell due during the election: the grace
            (0, 2000, 2000),      // ... capped by a TTL shorter than the grace
            (3000, 2000, 3000),   // (an EXPIRE longer than the TTL) the promise still
        ];
        for (remaining, ttl, extension) in cases {
            assert_eq!(
                failover_deadline(p, ms(remaining), ms(ttl), g),
                p + ms(extension),
                "remaining {remaining} ms, ttl {ttl} ms"
            );
        }
        assert_eq!(
            failover_deadline(p, Duration::MAX, ms(1), g),
            p + FAR_FUTURE
        );
    }

    proptest! {
        /// Against the rule spelled out case by case, in whole milliseconds.
        #[test]
        fn failover_deadline_matches_the_reference_formula(
            remaining_ms in 0u64..=400 * 86_400_000,
            ttl_ms in 1u64..=365 * 86_400_000,
            grace_ms in 0u64..=60_000,
        ) {
            let p = Instant::now();
            let reference_ms = if ttl_ms <= grace_ms {
                if remaining_ms >= ttl_ms { remaining_ms } else { ttl_ms }
            } else if remaining_ms >= grace_ms {
                remaining_ms
            } else {
                grace_ms
            };
            let deadline = failover_deadline(p, ms(remaining_ms), ms(ttl_ms), ms(grace_ms));
            prop_assert_eq!(deadline, p + ms(reference_ms));
            // Never shorter than the old leader's promise, never shorter than the capped grace.
            prop_assert!(deadline >= p + ms(remaining_ms));
            prop_assert!(deadline >= p + ms(ttl_ms.min(grace_ms)));
        }
    }
}
