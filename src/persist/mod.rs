//! Persistence: the registry's durable changes as an append-only log of records, and snapshots
//! that let the log be truncated (the Redis AOF + RDB model; the records are shaped to become
//! replicated log entries).
//!
//! - [`record`]: what is written, and its binary encoding.
//! - [`log`]: the framing (length, checksum, format version) and reading files back, telling
//!   a torn tail (a crash mid-append) from corruption.
//! - [`journal`]: appending records with group commit and the `--fsync` modes, surviving a
//!   full disk.
//! - [`store`]: the data directory (lock, file layout), recovery, and snapshots.
//! - [`webhooks`]: replaying the webhook records into the events still held and the dead
//!   letters.

pub mod journal;
pub mod log;
pub mod record;
pub mod store;
pub mod webhooks;
