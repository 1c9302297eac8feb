//! The far sides as services over HTTP (`--processor-url`, `--mailer-url`):
//! `src/bin/farside.rs`, or anything with its API. What each answer means for
//! the operation is decided here: only an answer that says nothing was done
//! (a 503 that says so, or a connection that was never made) is a
//! rejection; everything else after the request may have left is unknown.

use std::time::Duration;

use idem_runtime::{follow_ons::FollowOnRun, ToolError};
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::model::{ChargeArgs, ChargeStatus, Receipt};

/// A processor and a mailer reached over HTTP.
#[derive(Clone, Debug)]
pub struct Remote {
    http: reqwest::Client,
    processor: Option<String>,
    mailer: Option<String>,
}

impl Remote {
    /// The services at these base URLs (`http://HOST:PORT`); `None` keeps
    /// that far side in process.
    pub fn new(processor: Option<String>, mailer: Option<String>) -> Self {
        let trim = |url: String| url.trim_end_matches('/').to_owned();
        Remote {
            // Lookups and mails give up after this; a charge is bounded by
            // the tool's own processor timeout.
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()
                .expect("an HTTP client"),
            processor: processor.map(trim),
            mailer: mailer.map(trim),
        }
    }

    /// Whether charges go to a processor service.
    pub fn has_processor(&self) -> bool {
        self.processor.is_some()
    }

    /// Whether receipts go to a mailer service.
    pub fn has_mailer(&self) -> bool {
        self.mailer.is_some()
    }

    /// `POST /charges` with `reference` as the idempotency key.
    pub async fn charge(&self, reference: &str, args: &ChargeArgs) -> Result<Receipt, ToolError> {
        let url = format!("{}/charges", self.processor.as_deref().unwrap_or_default());
        let body = serde_json::to_string(args).map_err(|e| ToolError::rejected(e.to_string()))?;
        let sent = self
            .http
            .post(url)
            .header("Idempotency-Key", reference)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // No connection was made: the request never left.
            Err(e) if e.is_connect() => {
                return Err(ToolError::rejected(format!(
                    "The processor could not be reached ({e}); nothing was charged."
                )))
            }
            Err(e) => {
                return Err(ToolError::unknown(format!(
                    "The connection to the processor failed ({e}); the charge may or may not \
                     have gone through."
                )))
            }
        };
        let status = response.status();
        let text = response.text().await.map_err(|e| {
            ToolError::unknown(format!(
                "The processor's answer was lost ({e}); the charge may or may not have gone \
                 through."
            ))
        })?;
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        match status {
            StatusCode::OK => match answer["id"].as_str() {
                Some(id) => Ok(Receipt {
                    charge_id: id.to_owned(),
                    amount_cents: args.amount_cents,
                    currency: args.currency.clone(),
                    reference: reference.to_owned(),
                }),
                None => Err(ToolError::unknown(format!(
                    "The processor answered without a charge id ({text})."
                ))),
            },
            StatusCode::SERVICE_UNAVAILABLE if answer["performed"] == json!(false) => {
                Err(ToolError::rejected(
                    "The processor is unavailable right now; nothing was charged. Try again \
                     in a moment.",
                ))
            }
            StatusCode::CONFLICT => Err(ToolError::unknown(
                "The processor is still working on an earlier request for this operation; \
                 the charge may or may not go through.",
            )),
            other => Err(ToolError::unknown(format!(
                "The processor answered {other} ({text}); the charge may or may not have gone \
                 through."
            ))),
        }
    }

    /// `GET /charges/{reference}`: the processor's lookup.
    pub async fn charge_status(&self, reference: &str) -> Result<ChargeStatus, String> {
        let url = format!(
            "{}/charges/{reference}",
            self.processor.as_deref().unwrap_or_default()
        );
        let response = self
            .http
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| format!("processor lookup: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("processor lookup: {}", response.status()));
        }
        let found: Value = response
            .json()
            .await
            .map_err(|e| format!("processor lookup: {e}"))?;
        match found["status"].as_str() {
            Some("not_found") => Ok(ChargeStatus::NotFound),
            Some("in_flight") => Ok(ChargeStatus::InFlight),
            Some("done") => {
                let answer = &found["answer"];
                // The charge as it was asked for: what the tool's receipt says.
                let args: ChargeArgs = serde_json::from_value(answer["request"].clone())
                    .map_err(|e| format!("processor lookup: {e}: {found}"))?;
                Ok(ChargeStatus::Charged(Receipt {
                    charge_id: answer["id"]
                        .as_str()
                        .ok_or_else(|| format!("processor lookup: no charge id: {found}"))?
                        .to_owned(),
                    amount_cents: args.amount_cents,
                    currency: args.currency,
                    reference: reference.to_owned(),
                }))
            }
            _ => Err(format!("processor lookup: {found}")),
        }
    }

    /// `POST /messages` with the follow-on's downstream key as the idempotency key.
    pub async fn send(&self, job: &FollowOnRun) -> Result<(), String> {
        let url = format!("{}/messages", self.mailer.as_deref().unwrap_or_default());
        let body = json!({
            "reference": job.reference.to_string(),
            "job": job.name,
            "payload": serde_json::from_str::<Value>(&job.payload).unwrap_or(Value::Null),
        });
        let response = self
            .http
            .post(url)
            .timeout(Duration::from_secs(5))
            .header("Idempotency-Key", job.downstream_key.as_str())
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("mailer: {e}"))?;
        match response.status() {
            StatusCode::OK => Ok(()),
            other => Err(format!(
                "mailer answered {other}: {}",
                response.text().await.unwrap_or_default()
            )),
        }
    }
}
