//! `ttlwheel services | events | guard | cluster | health`: the operator's other questions.

use futures_util::StreamExt;
use ttlwheel_client::{Client, ClusterStatus, Event, EventsQuery, GuardStatus};

use super::output::{cell, fields, json_line, millis, print, table};
use super::{CliError, Output};

#[derive(Clone, Debug, clap::Subcommand)]
pub enum GuardAction {
    /// The guard's state: armed, engaged (holding due keys), releasing.
    Status,
    /// Holds due keys from now (for at most the maximum hold).
    Engage,
    /// Ends the hold: held keys expire at the bounded release rate.
    Release,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum ClusterAction {
    /// Members, the leader, and how far each member's log trails the commit index.
    Status,
    /// Adds a member as a learner (admin): it gets the log, and votes once promoted.
    Add {
        /// The new member's `--node-id`.
        id: u64,
        /// Its `--cluster-listen` address as peers reach it (HOST:PORT).
        #[arg(long)]
        peer_addr: String,
        /// Its API's URL as clients reach it (`--advertise-api`).
        #[arg(long)]
        api_addr: String,
    },
    /// Makes a caught-up learner a voter (admin); refused until it is caught up: run it again.
    Promote {
        /// The learner's id.
        id: u64,
    },
    /// Removes a member, voter or learner (admin); then stop its process.
    Remove {
        /// The member's id.
        id: u64,
    },
}

pub async fn services(client: &Client, output: Output) -> Result<(), CliError> {
    let services = client.services().await?;
    if output == Output::Json {
        return Ok(json_line(&services)?);
    }
    let mut rows: Vec<Vec<String>> = services
        .services
        .iter()
        .map(|service| {
            vec![
                service.service.clone(),
                service.alive.to_string(),
                service.expired.to_string(),
            ]
        })
        .collect();
    rows.push(vec![
        "(no service)".into(),
        services.without_service.alive.to_string(),
        services.without_service.expired.to_string(),
    ]);
    rows.push(vec![
        "(total)".into(),
        services.total.alive.to_string(),
        services.total.expired.to_string(),
    ]);
    Ok(print(&table(&["SERVICE", "ALIVE", "EXPIRED"], &rows))?)
}

/// Follows the stream until it ends with an error (or the process is interrupted).
pub async fn events(client: &Client, query: EventsQuery, output: Output) -> Result<(), CliError> {
    let mut stream = std::pin::pin!(client.events(query).await?);
    while let Some(event) = stream.next().await {
        let event = event?;
        match output {
            Output::Json => json_line(&event)?,
            Output::Table => print(&event_line(&event))?,
        }
    }
    Ok(())
}

/// One event for people: `<when>  <type>  <key>  <details>`.
fn event_line(event: &Event) -> String {
    let text = |field: &str| {
        event
            .data
            .get(field)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    match event.kind.as_str() {
        "reset" => format!(
            "-  reset  {}\n",
            text("reason").unwrap_or_else(|| "events were missed: re-read the lists".into())
        ),
        kind if kind.starts_with("guard.") => format!(
            "{}  {kind}  {}\n",
            cell(text("occurred_at").or_else(|| text("since"))),
            event.data
        ),
        kind => {
            let mut line = format!(
                "{}  {kind:<10}  {}",
                cell(text("occurred_at")),
                cell(event.key())
            );
            if let Some(service) = event.service() {
                line.push_str(&format!("  service={service}"));
            }
            if kind == "expired" {
                if let Some(late) = event.data.get("lateness_ms").and_then(|v| v.as_u64()) {
                    line.push_str(&format!("  late={late}ms"));
                }
            }
            line.push('\n');
            line
        }
    }
}

pub async fn guard(action: GuardAction, client: &Client, output: Output) -> Result<(), CliError> {
    let status = match action {
        GuardAction::Status => client.guard_status().await?,
        GuardAction::Engage => client.guard_engage().await?,
        GuardAction::Release => client.guard_release().await?,
    };
    match output {
        Output::Json => json_line(&status)?,
        Output::Table => print(&describe_guard(&status))?,
    }
    Ok(())
}

fn describe_guard(status: &GuardStatus) -> String {
    let other = |name: &str| {
        status
            .other
            .get(name)
            .filter(|value| !value.is_null())
            .map(|value| match value {
                serde_json::Value::String(text) => text.clone(),
                value => value.to_string(),
            })
    };
    fields(&[
        ("state", Some(status.state.clone())),
        ("enabled", Some(status.enabled.to_string())),
        ("held keys", Some(status.held.to_string())),
        ("since", status.since.clone()),
        ("hold ends at", status.hold_ends_at.clone()),
        (
            "time left",
            status
                .time_left_s
                .map(|seconds| millis((seconds * 1000.0) as u64)),
        ),
        ("engaged by", other("engaged_by")),
        ("baseline", other("baseline")),
        ("expiring", other("expiring")),
        ("release per s", other("release_per_s")),
        ("engagements", other("engagements")),
        ("releases", other("releases")),
        ("threshold", other("threshold")),
    ])
}

pub async fn cluster(
    action: ClusterAction,
    client: &Client,
    output: Output,
) -> Result<(), CliError> {
    let status = match action {
        ClusterAction::Status => client.cluster_status().await?,
        ClusterAction::Add {
            id,
            peer_addr,
            api_addr,
        } => client.add_member(id, &peer_addr, &api_addr).await?,
        ClusterAction::Promote { id } => client.promote_member(id).await?,
        ClusterAction::Remove { id } => client.remove_member(id).await?,
    };
    match output {
        Output::Json => json_line(&status)?,
        Output::Table => print(&describe_cluster(&status))?,
    }
    Ok(())
}

fn describe_cluster(status: &ClusterStatus) -> String {
    let mut text = format!(
        "node {} ({}), leader {} at {}, term {}, committed {}, applied {}\n\n",
        status.node_id,
        status.role,
        cell(status.leader_id.as_ref()),
        cell(status.leader_api.as_ref()),
        status.term,
        status.committed_index,
        status.applied_index,
    );
    if let Some(snapshot) = status.snapshot_index {
        let purged = match status.purged_index {
            Some(purged) => format!("log purged through {purged}"),
            None => "whole log kept".to_owned(),
        };
        text.insert_str(text.len() - 2, &format!(", snapshot {snapshot} ({purged})"));
    }
    if let Some(membership) = &status.membership {
        let sets: Vec<String> = (membership.voters.iter())
            .map(|set| {
                let ids: Vec<String> = set.iter().map(ToString::to_string).collect();
                format!("{{{}}}", ids.join(","))
            })
            .collect();
        let state = match (membership.changing, membership.voters.len() > 1) {
            (false, _) => "",
            (true, true) => " (changing: joint phase, a quorum of each set)",
            (true, false) => " (changing: not committed yet)",
        };
        text.insert_str(
            text.len() - 1,
            &format!("voters {}{state}\n", sets.join(" -> ")),
        );
    }
    if status.may_campaign == Some(false) && status.leader_id.as_ref() != Some(&status.node_id) {
        text.insert_str(
            text.len() - 1,
            "may not campaign: too few voters answer that they would vote for it\n",
        );
    }
    let rows: Vec<Vec<String>> = status
        .members
        .iter()
        .map(|member| {
            let leader = status.leader_id.as_ref() == Some(&member.id);
            vec![
                member.id.to_string(),
                if leader {
                    "leader".into()
                } else if member.voter {
                    "voter".into()
                } else {
                    "learner".into()
                },
                member.api_addr.clone(),
                member.peer_addr.clone(),
                cell(member.matched_index),
                cell(
                    member
                        .matched_index
                        .map(|matched| status.committed_index.saturating_sub(matched)),
                ),
                cell(member.last_contact_ms.map(millis)),
            ]
        })
        .collect();
    text.push_str(&table(
        &[
            "ID",
            "ROLE",
            "API",
            "PEER",
            "MATCHED",
            "LAG",
            "LAST CONTACT",
        ],
        &rows,
    ));
    text
}

pub async fn health(client: &Client, output: Output) -> Result<(), CliError> {
    let health = client.health().await?;
    match output {
        Output::Json => json_line(&health)?,
        Output::Table => print(&format!(
            "{}\n",
            health
                .get("status")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("ok")
        ))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cluster_is_shown_with_each_members_lag_behind_the_commit() {
        let status: ClusterStatus = serde_json::from_value(json!({
            "node_id": 2, "role": "follower", "leader_id": 1,
            "leader_api": "http://10.0.0.1:7878", "term": 3,
            "committed_index": 120, "applied_index": 119,
            "members": [
                {"id": 1, "peer_addr": "10.0.0.1:7879", "api_addr": "http://10.0.0.1:7878",
                 "voter": true, "matched_index": 120, "last_contact_ms": 0},
                {"id": 2, "peer_addr": "10.0.0.2:7879", "api_addr": "http://10.0.0.2:7878",
                 "voter": true, "matched_index": 117, "last_contact_ms": 40},
                {"id": 3, "peer_addr": "10.0.0.3:7879", "api_addr": "http://10.0.0.3:7878",
                 "voter": false, "matched_index": null, "last_contact_ms": null}
            ]
        }))
        .expect("the documented shape");
        let text = describe_cluster(&status);
        assert!(
            text.starts_with("node 2 (follower), leader 1 at http://10.0.0.1:7878, term 3"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert!(lines[0].starts_with("ID  ROLE"), "{text}");
        assert!(
            lines[1].starts_with("1   leader") && lines[1].contains(" 0 "),
            "{text}"
        );
        assert!(
            lines[2].starts_with("2   voter") && lines[2].contains(" 3 "),
            "{text}"
        );
        assert!(lines[3].starts_with("3   learner"), "{text}");
        assert!(!text.contains("voters"), "no membership reported: {text}");
        assert!(!text.contains("snapshot"), "no snapshot reported: {text}");
    }

    /// A membership change in its joint phase, on a follower that may not campaign: both
    /// voter sets and both states are shown before the members.
    #[test]
    fn a_joint_membership_and_a_closed_campaign_gate_are_shown() {
        let status: ClusterStatus = serde_json::from_value(json!({
            "node_id": 2, "role": "follower", "leader_id": null, "leader_api": null,
            "term": 4, "committed_index": 130, "applied_index": 130, "may_campaign": false,
            "snapshot_index": 100, "purged_index": 80, "members": [],
            "membership": {"voters": [[1, 2, 3], [1, 2, 3, 4]], "log_index": 129,
                           "committed": true, "changing": true}
        }))
        .expect("the documented shape");
        let text = describe_cluster(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with("applied 130, snapshot 100 (log purged through 80)"),
            "{text}"
        );
        assert_eq!(
            lines[1], "voters {1,2,3} -> {1,2,3,4} (changing: joint phase, a quorum of each set)",
            "{text}"
        );
        assert!(lines[2].starts_with("may not campaign"), "{text}");
        assert_eq!(lines[3], "", "{text}");
    }

    #[test]
    fn events_read_as_one_line_each() {
        let event = Event {
            id: "0000abcd-9".into(),
            kind: "expired".into(),
            data: json!({"key": "api/1", "service": "api",
                         "occurred_at": "2026-11-23T12:00:00.000Z", "lateness_ms": 2}),
        };
        assert_eq!(
            event_line(&event),
            "2026-11-23T12:00:00.000Z  expired     api/1  service=api  late=2ms\n"
        );
        let reset = Event {
            id: "x".into(),
            kind: "reset".into(),
            data: json!({"reason": "fell behind"}),
        };
        assert_eq!(event_line(&reset), "-  reset  fell behind\n");
    }
}
