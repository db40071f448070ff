//! `ttlwheel keys ...`: list, show, heartbeat, expire, persist and delete keys.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use ttlwheel_client::{
    Client, ExpireAt, ExpireCondition, ExpiredKey, Heartbeat, KeyInfo, KeyTtl, ListQuery,
};

use super::output::{cell, fields, json_line, millis, print, table};
use super::{CliError, Output};

/// Which keys `keys ls` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyStateArg {
    /// Alive keys (held ones included).
    Alive,
    /// Keys the mass-expiry guard holds.
    Held,
    /// Recently expired keys.
    Expired,
}

/// An EXPIRE condition (Redis 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConditionArg {
    /// Only if the key has no TTL.
    Nx,
    /// Only if it has one.
    Xx,
    /// Only if the new deadline is later.
    Gt,
    /// Only if it is earlier.
    Lt,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum KeysAction {
    /// Lists keys, sorted by key (alive ones unless `--state` says otherwise).
    Ls {
        /// Only keys of this service.
        #[arg(long)]
        service: Option<String>,
        /// Only keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// `alive`, `held` (by the mass-expiry guard) or `expired` (recently).
        #[arg(long, value_enum, default_value = "alive")]
        state: KeyStateArg,
        /// Most keys to print (0: all, page after page).
        #[arg(long, default_value_t = 1000)]
        limit: u64,
    },
    /// Shows one alive key.
    Get { key: String },
    /// A key's time left (Redis PTTL).
    Ttl { key: String },
    /// Sends one heartbeat: registers the key or renews it.
    Heartbeat {
        key: String,
        /// The TTL (`30s`, `1500ms`, `2m`); without it, the server's `--default-ttl`.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// The key's service.
        #[arg(long)]
        service: Option<String>,
        /// The key's metadata: a JSON object.
        #[arg(long, value_parser = parse_meta)]
        meta: Option<serde_json::Value>,
    },
    /// Sets a key's TTL from now (Redis PEXPIRE); `0s` deletes it.
    Expire {
        key: String,
        /// The new TTL (`10s`, `500ms`, `1h`).
        #[arg(value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Only when the condition holds.
        #[arg(long, value_enum)]
        condition: Option<ConditionArg>,
    },
    /// Removes a key's TTL: it no longer expires (Redis PERSIST).
    Persist { key: String },
    /// Deletes (deregisters) a key: a `deleted` event, not an `expired` one.
    Del { key: String },
}

/// `--meta`: a JSON object.
fn parse_meta(text: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err("must be a JSON object, e.g. '{\"zone\":\"eu-1\"}'".into()),
        Err(error) => Err(format!("not JSON: {error}")),
    }
}

pub async fn run(action: KeysAction, client: &Client, output: Output) -> Result<(), CliError> {
    match action {
        KeysAction::Ls {
            service,
            prefix,
            state,
            limit,
        } => {
            let query = ListQuery {
                service,
                prefix,
                page_size: Some(1000),
            };
            list(client, query, state, limit, output).await
        }
        KeysAction::Get { key } => {
            let info = client.get(&key).await?;
            match output {
                Output::Json => json_line(&info)?,
                Output::Table => print(&describe(&info))?,
            }
            Ok(())
        }
        KeysAction::Ttl { key } => {
            let ttl = client.ttl(&key).await?;
            let ttl_ms = match ttl {
                KeyTtl::ExpiresIn(left) => i64::try_from(left.as_millis()).unwrap_or(i64::MAX),
                KeyTtl::Persistent => -1,
            };
            match output {
                Output::Json => json_line(&json!({ "key": key, "ttl_ms": ttl_ms }))?,
                Output::Table => print(&match ttl {
                    KeyTtl::ExpiresIn(_) => format!("{}\n", millis(ttl_ms as u64)),
                    KeyTtl::Persistent => "no TTL (it never expires)\n".to_owned(),
                })?,
            }
            Ok(())
        }
        KeysAction::Heartbeat {
            key,
            ttl,
            service,
            meta,
        } => {
            let heartbeat = Heartbeat {
                key,
                ttl_ms: ttl.map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
                service,
                meta,
            };
            let outcome = client.heartbeat(&heartbeat).await?;
            match output {
                Output::Json => json_line(&outcome)?,
                Output::Table => print(&format!(
                    "{} {} (TTL {}, expires at {})\n",
                    if outcome.created {
                        "registered"
                    } else {
                        "renewed"
                    },
                    outcome.key,
                    millis(outcome.ttl_ms),
                    outcome.expires_at
                ))?,
            }
            Ok(())
        }
        KeysAction::Expire {
            key,
            ttl,
            condition,
        } => {
            let condition = condition.map(|condition| match condition {
                ConditionArg::Nx => ExpireCondition::Nx,
                ConditionArg::Xx => ExpireCondition::Xx,
                ConditionArg::Gt => ExpireCondition::Gt,
                ConditionArg::Lt => ExpireCondition::Lt,
            });
            let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            let outcome = client.expire(&key, ExpireAt::In(ms), condition).await?;
            match output {
                Output::Json => json_line(&outcome)?,
                Output::Table => print(&match (outcome.applied, outcome.deleted) {
                    (_, true) => format!("{key}: deleted (a TTL of 0)\n"),
                    (true, false) => format!("{key}: expires in {}\n", millis(ms as u64)),
                    (false, false) => format!(
                        "{key}: unchanged (the condition does not hold; TTL {})\n",
                        match outcome.ttl_ms {
                            Some(ms) if ms >= 0 => millis(ms as u64),
                            _ => "none".to_owned(),
                        }
                    ),
                })?,
            }
            Ok(())
        }
        KeysAction::Persist { key } => {
            let applied = client.persist(&key).await?;
            match output {
                Output::Json => json_line(&json!({ "key": key, "applied": applied }))?,
                Output::Table => print(&if applied {
                    format!("{key}: no longer expires\n")
                } else {
                    format!("{key}: had no TTL\n")
                })?,
            }
            Ok(())
        }
        KeysAction::Del { key } => {
            client.delete(&key).await?;
            match output {
                Output::Json => json_line(&json!({ "key": key, "deleted": true }))?,
                Output::Table => print(&format!("deleted {key}\n"))?,
            }
            Ok(())
        }
    }
}

/// `keys ls`: pages as they come; JSON is one array, written as it grows.
async fn list(
    client: &Client,
    query: ListQuery,
    state: KeyStateArg,
    limit: u64,
    output: Output,
) -> Result<(), CliError> {
    let limit = if limit == 0 { u64::MAX } else { limit };
    let rows = match state {
        KeyStateArg::Expired => {
            let keys = client.list_expired(query);
            collect(keys, limit, output, expired_row).await?
        }
        KeyStateArg::Alive => collect(client.list(query), limit, output, alive_row).await?,
        KeyStateArg::Held => collect(client.list_held(query), limit, output, alive_row).await?,
    };
    if let (Output::Table, Some((rows, more))) = (output, rows) {
        let header: &[&str] = match state {
            KeyStateArg::Expired => &["KEY", "SERVICE", "EXPIRED AT", "LAST HEARTBEAT"],
            _ => &[
                "KEY",
                "SERVICE",
                "STATE",
                "TTL",
                "EXPIRES IN",
                "LAST HEARTBEAT",
            ],
        };
        print(&table(header, &rows))?;
        if more {
            eprintln!("(more keys: --limit 0 lists them all)");
        }
    }
    Ok(())
}

/// Reads up to `limit` items of `keys`: for JSON, writes them as one array and returns
/// `None`; for a table, returns the rows and whether more keys were left.
async fn collect<T: serde::Serialize>(
    keys: impl futures_util::Stream<Item = Result<T, ttlwheel_client::Error>>,
    limit: u64,
    output: Output,
    row: fn(&T) -> Vec<String>,
) -> Result<Option<(Vec<Vec<String>>, bool)>, CliError> {
    let mut keys = std::pin::pin!(keys);
    let mut rows = Vec::new();
    let mut count = 0;
    if output == Output::Json {
        print("[")?;
    }
    while let Some(key) = keys.next().await {
        if count == limit {
            return Ok(finish(output, rows, true)?);
        }
        let key = key?;
        match output {
            Output::Json => {
                let separator = if count == 0 { "" } else { "," };
                print(&format!(
                    "{separator}\n{}",
                    serde_json::to_string(&key).expect("serializes")
                ))?;
            }
            Output::Table => rows.push(row(&key)),
        }
        count += 1;
    }
    Ok(finish(output, rows, false)?)
}

fn finish(
    output: Output,
    rows: Vec<Vec<String>>,
    more: bool,
) -> std::io::Result<Option<(Vec<Vec<String>>, bool)>> {
    match output {
        Output::Json => {
            print("\n]\n")?;
            Ok(None)
        }
        Output::Table => Ok(Some((rows, more))),
    }
}

fn alive_row(key: &KeyInfo) -> Vec<String> {
    vec![
        key.key.clone(),
        cell(key.service.as_ref()),
        key.state.clone(),
        cell(key.ttl_ms.map(millis)),
        cell(key.expires_in_ms.map(millis)),
        key.last_heartbeat_at.clone(),
    ]
}

fn expired_row(key: &ExpiredKey) -> Vec<String> {
    vec![
        key.key.clone(),
        cell(key.service.as_ref()),
        key.expired_at.clone(),
        key.last_heartbeat_at.clone(),
    ]
}

/// `keys get` for people.
fn describe(info: &KeyInfo) -> String {
    fields(&[
        ("key", Some(info.key.clone())),
        ("service", info.service.clone()),
        ("state", Some(info.state.clone())),
        ("ttl", info.ttl_ms.map(millis)),
        ("expires in", info.expires_in_ms.map(millis)),
        ("expires at", info.expires_at.clone()),
        ("registered at", Some(info.registered_at.clone())),
        ("last heartbeat", Some(info.last_heartbeat_at.clone())),
        ("timer", info.timer.clone()),
        ("meta", info.meta.as_ref().map(ToString::to_string)),
    ])
}
