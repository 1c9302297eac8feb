//! [`DynamoDbStoreBuilder`]: the client, the table, the clock and how long
//! a migration waits; and the store a `dynamodb://` URL names.

use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::Client;

use super::table::LAPSED_UNASKED;
use super::DynamoDbStore;
use crate::store::StoreError;

/// The clocks' spread a store assumes unless told.
const DEFAULT_CLOCK_SPREAD: Duration = Duration::from_secs(1);

/// How long a migration waits for the table and its indexes unless told:
/// DynamoDB builds a new index from every item of the table, minutes for a
/// table of a few GB.
const DEFAULT_MIGRATE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Configures a [`DynamoDbStore`]: the table and where the store reads the
/// time.
#[derive(Clone)]
pub struct DynamoDbStoreBuilder {
    client: Client,
    table: String,
    clock: Option<super::Clock>,
    clock_spread: Duration,
    migrate_timeout: Duration,
}

impl std::fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoDbStoreBuilder")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStoreBuilder {
    pub(super) fn new(client: Client, table: String) -> Self {
        DynamoDbStoreBuilder {
            client,
            table,
            clock: None,
            clock_spread: DEFAULT_CLOCK_SPREAD,
            migrate_timeout: DEFAULT_MIGRATE_TIMEOUT,
        }
    }

    /// Reads the time from `clock` instead of the process clock: a
    /// simulation runs leases, windows and settle periods on its own time.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How far the replicas' clocks may disagree (default 1 s; keep it far
    /// below the lease, as docs/clocks.md says). The sweep
    /// walks the `leases` index from a cursor another replica may have
    /// moved on its own clock; each walk starts this far behind the cursor,
    /// so a claim written on a clock that far behind is still found. Each
    /// round reads the records of that span again (half a read unit each):
    /// raise it only with the clocks' real spread.
    pub fn clock_spread(mut self, spread: Duration) -> Self {
        self.clock_spread = spread;
        self
    }

    /// How long [`migrate`](DynamoDbStore::migrate) and
    /// [`create_table`](DynamoDbStore::create_table) wait for DynamoDB to
    /// build the table and its indexes, and [`connect`](DynamoDbStore::connect)
    /// for a `leases` index another starter is adding (default 10 minutes).
    /// DynamoDB fills a new index from every item of the table: a few
    /// minutes for a few GB, longer beyond. A wait that runs out is
    /// `Unavailable`, and changes nothing: the index goes on being built,
    /// and the next `migrate` waits for it from where it is.
    pub fn migrate_timeout(mut self, timeout: Duration) -> Self {
        self.migrate_timeout = timeout;
        self
    }

    /// The store. Sends nothing to DynamoDB. Errors: `Config` for a table
    /// name DynamoDB would refuse (3 to 255 characters from `A-Z a-z 0-9 _
    /// - .`).
    pub fn build(self) -> Result<DynamoDbStore, StoreError> {
        check_table_name(&self.table)?;
        Ok(DynamoDbStore {
            client: self.client,
            table: self.table.into(),
            clock: self.clock,
            clock_spread: self.clock_spread,
            migrate_timeout: self.migrate_timeout,
            lapsed_index: Arc::new(AtomicU8::new(LAPSED_UNASKED)),
        })
    }
}

fn check_table_name(table: &str) -> Result<(), StoreError> {
    let valid = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(StoreError::Config(format!(
            "invalid DynamoDB table name {table:?}: use 3 to 255 characters from A-Z a-z 0-9 _ - ."
        )))
    }
}

/// What a `dynamodb://TABLE?region=…&endpoint=…` URL names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) table: String,
    pub(crate) region: Option<String>,
    pub(crate) endpoint: Option<String>,
}

/// Parses `dynamodb://TABLE[?region=REGION][&endpoint=URL]`. Errors:
/// `Config`, saying what the URL should look like.
pub(crate) fn parse_url(url: &str) -> Result<Target, StoreError> {
    let usage = "use dynamodb://TABLE?region=REGION, and &endpoint=http://HOST:PORT for an \
                 emulator (e.g. dynamodb://idem?region=us-east-1&endpoint=http://127.0.0.1:4567)";
    let rest = url
        .strip_prefix("dynamodb://")
        .ok_or_else(|| StoreError::Config(format!("{url:?} is not a DynamoDB URL: {usage}")))?;
    let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
    let table = table.trim_end_matches('/');
    if table.is_empty() {
        return Err(StoreError::Config(format!(
            "{url:?} names no table: {usage}"
        )));
    }
    check_table_name(table)?;
    let mut target = Target {
        table: table.to_owned(),
        region: None,
        endpoint: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("region", v)) if !v.is_empty() => target.region = Some(v.to_owned()),
            Some(("endpoint", v)) if v.starts_with("http://") || v.starts_with("https://") => {
                target.endpoint = Some(v.to_owned())
            }
            _ => {
                return Err(StoreError::Config(format!(
                    "{url:?}: unknown or empty parameter {pair:?}; {usage}"
                )))
            }
        }
    }
    Ok(target)
}

/// An environment variable, `None` when unset or empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl DynamoDbStore {
    /// A builder for the table a `dynamodb://TABLE?region=…&endpoint=…`
    /// URL names, on a client of its own: the region from the URL (else
    /// `AWS_REGION`, else `AWS_DEFAULT_REGION`), the endpoint from the URL
    /// (else AWS's for the region; an emulator's is
    /// `endpoint=http://127.0.0.1:4567`), the credentials from
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`
    /// (there is no aws-config here: no profiles, no instance roles; for
    /// those, build the client with aws-config and call
    /// [`DynamoDbStore::builder`]), HTTPS by rustls, a 5-second timeout per
    /// attempt and a 3-second connect timeout. Sends nothing. Errors:
    /// `Config`, saying what to write.
    pub fn from_url(url: &str) -> Result<DynamoDbStoreBuilder, StoreError> {
        use aws_sdk_dynamodb::config::{
            timeout::TimeoutConfig, BehaviorVersion, Credentials, Region,
        };
        use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

        let target = parse_url(url)?;
        let region = target
            .region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .ok_or_else(|| {
                StoreError::Config(format!(
                    "{url:?} names no region: add ?region=REGION, or set AWS_REGION"
                ))
            })?;
        let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(StoreError::Config(
                "a dynamodb:// URL takes its credentials from AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), which are not set; an emulator \
                 takes any (e.g. testing/testing)"
                    .into(),
            ));
        };
        let credentials =
            Credentials::new(id, secret, env("AWS_SESSION_TOKEN"), None, "environment");
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
            .http_client(http)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_attempt_timeout(Duration::from_secs(5))
                    .build(),
            );
        if let Some(endpoint) = target.endpoint {
            config = config.endpoint_url(endpoint);
        }
        Ok(Self::builder(
            Client::from_conf(config.build()),
            target.table,
        ))
    }
}

/// The store a `dynamodb://` URL names ([`DynamoDbStore::from_url`]),
/// checked to exist. Errors: `Config`, `Unavailable`.
pub(crate) async fn open_url(url: &str) -> Result<DynamoDbStore, StoreError> {
    let store = DynamoDbStore::from_url(url)?.build()?;
    store.check_table().await?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_what_to_write() {
        assert_eq!(
            parse_url("dynamodb://idem?region=eu-west-1&endpoint=http://127.0.0.1:4567").unwrap(),
            Target {
                table: "idem".into(),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:4567".into()),
            }
        );
        assert_eq!(
            parse_url("dynamodb://idem").unwrap(),
            Target {
                table: "idem".into(),
                region: None,
                endpoint: None,
            }
        );
        for bad in [
            "dynamodb://",
            "dynamodb://?region=x",
            "dynamodb://a",
            "dynamodb://idem?colour=blue",
            "dynamodb://idem?endpoint=127.0.0.1:4567",
            "dynamodb://bad table",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(
                e.contains("table") || e.contains("dynamodb://"),
                "{bad}: {e}"
            );
        }
    }
}
