//! The operator's CLI: `ttlwheel keys|services|events|guard|cluster|health ...`, subcommands of
//! the one binary that talk to a running server through `ttlwheel-client` (the library
//! services use), so the CLI fails over between `--endpoint`s as they do.
//!
//! Output is a human table by default and JSON with `--output json` (one document, or one line
//! per event for `events`), on stdout; errors go to stderr. The exit code says what happened
//! ([`exit`]): scripts can tell "no such key" from "no server answered".
//!
//! Deliberately absent: anything the server does not serve (the CLI never reads the data
//! directory), and a configuration file (flags and `TTLWHEEL_ENDPOINT` / `TTLWHEEL_TOKEN`).

mod admin;
mod keys;
mod output;

use std::path::PathBuf;
use std::time::Duration;

use ttlwheel_client::{Client, Error, Tls};

pub use admin::{ClusterAction, GuardAction};
pub use keys::{KeyStateArg, KeysAction};

/// The exit codes (documented in the README, "The CLI").
pub mod exit {
    /// Done.
    pub const OK: i32 = 0;
    /// The server refused the request (a 4xx other than not found: bad input, no token, no
    /// right), or something else went wrong.
    pub const FAILED: i32 = 1;
    /// Bad usage: an unknown flag or a bad value (clap's own code).
    pub const USAGE: i32 = 2;
    /// The key (or route) does not exist.
    pub const NOT_FOUND: i32 = 3;
    /// No endpoint answered: refused connections, timeouts, 502/503/504 on every attempt.
    pub const UNAVAILABLE: i32 = 4;
    /// `cluster status` against a single node (no `/v1/cluster`).
    pub const NOT_CLUSTERED: i32 = 5;
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts: the API's own shapes.
    Json,
}

/// Where the server is and how to talk to it: accepted after any client subcommand.
#[derive(Clone, Debug, clap::Args)]
pub struct ClientArgs {
    /// A server's address; repeat it (or comma-separate in the environment variable) for
    /// several: a request that fails on one is retried on the next.
    #[arg(long = "endpoint", env = "TTLWHEEL_ENDPOINT", value_delimiter = ',',
          default_value = ttlwheel_client::DEFAULT_ENDPOINT, global = true, value_name = "URL")]
    pub endpoints: Vec<String>,

    /// The token (`ttlw_<id>_<secret>`). Prefer the environment variable or `--token-file`:
    /// flags show in `ps`.
    #[arg(
        long,
        env = "TTLWHEEL_TOKEN",
        hide_env_values = true,
        global = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,

    /// A file holding the token (surrounding whitespace ignored).
    #[arg(
        long,
        env = "TTLWHEEL_TOKEN_FILE",
        global = true,
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,

    /// PEM CA certificates to trust for `https://` endpoints (default: the system's roots).
    #[arg(long, env = "TTLWHEEL_CA_CERT", global = true, value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,

    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "table", global = true)]
    pub output: Output,

    /// Time limit of one attempt (each endpoint is tried up to three times in all).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, global = true)]
    pub timeout: Duration,
}

impl ClientArgs {
    /// The client these flags describe.
    fn client(&self) -> Result<Client, CliError> {
        let mut builder = Client::builder()
            .endpoints(self.endpoints.iter().cloned())
            .timeout(self.timeout);
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|error| {
                        CliError::Other(format!("cannot read {}: {error}", path.display()))
                    })?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        if let Some(token) = token {
            builder = builder.token(token);
        }
        if let Some(path) = &self.ca_cert {
            let pem = std::fs::read(path).map_err(|error| {
                CliError::Other(format!("cannot read {}: {error}", path.display()))
            })?;
            builder = builder.tls(Tls::new().ca_pem(pem));
        }
        Ok(builder.build()?)
    }
}

/// The client subcommands (`token new` is the server's own: see `config::TokenCommand`).
#[derive(Clone, Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Keys of a running server: ls, get, ttl, heartbeat, expire, persist, del.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Alive and recently expired keys per service.
    Services {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Follows the live event stream (registered, expired, deleted, guard) until interrupted,
    /// resuming across reconnects.
    Events {
        /// Only events of this service.
        #[arg(long)]
        service: Option<String>,
        /// Only events of keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Start after this event id (what was missed, or a `reset`).
        #[arg(long)]
        since: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The mass-expiry guard: status, engage, release.
    Guard {
        #[command(subcommand)]
        action: GuardAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The cluster: status (members, leader, replication lag); members added, promoted,
    /// removed.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// `GET /healthz`: exit 0 when a server is healthy, 4 when none is (lagging, recovering,
    /// or not answering). For container health checks.
    Health {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Why a command failed, and so its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The client's error.
    #[error(transparent)]
    Client(#[from] Error),
    /// Anything else (an unreadable file, stdout closed).
    #[error("{0}")]
    Other(String),
}

impl CliError {
    /// The exit code of this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Client(error) if error.is_not_found() => exit::NOT_FOUND,
            Self::Client(Error::Unavailable { .. }) => exit::UNAVAILABLE,
            Self::Client(Error::NotClustered) => exit::NOT_CLUSTERED,
            Self::Client(_) | Self::Other(_) => exit::FAILED,
        }
    }

    /// What to tell the operator.
    fn explain(&self) -> String {
        match self {
            Self::Client(Error::NotClustered) => "this server is a single node (no /v1/cluster): \
                 there are no members, leader or lag to show"
                .to_owned(),
            Self::Client(Error::Unavailable { failures }) => {
                format!("no endpoint answered:\n  {}", failures.join("\n  "))
            }
            other => other.to_string(),
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(error: std::io::Error) -> Self {
        Self::Other(format!("cannot write the output: {error}"))
    }
}

/// Runs `command` on a runtime of its own; returns the exit code.
pub fn run(command: ClientCommand) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ttlwheel: cannot start a runtime: {error}");
            return exit::FAILED;
        }
    };
    match runtime.block_on(dispatch(command)) {
        Ok(()) => exit::OK,
        Err(error) => {
            eprintln!("ttlwheel: {}", error.explain());
            error.exit_code()
        }
    }
}

async fn dispatch(command: ClientCommand) -> Result<(), CliError> {
    match command {
        ClientCommand::Keys { action, client } => {
            keys::run(action, &client.client()?, client.output).await
        }
        ClientCommand::Services { client } => {
            admin::services(&client.client()?, client.output).await
        }
        ClientCommand::Events {
            service,
            prefix,
            since,
            client,
        } => {
            let query = ttlwheel_client::EventsQuery {
                service,
                prefix,
                last_event_id: since,
            };
            admin::events(&client.client()?, query, client.output).await
        }
        ClientCommand::Guard { action, client } => {
            admin::guard(action, &client.client()?, client.output).await
        }
        ClientCommand::Cluster { action, client } => {
            admin::cluster(action, &client.client()?, client.output).await
        }
        ClientCommand::Health { client } => admin::health(&client.client()?, client.output).await,
    }
}
