//! The payments example's data: the tools' arguments and results, the
//! follow-ons' payloads, and the stubs' ledger as the ledger tool shows it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `charge_card`'s arguments.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The card to charge (a token or the last four digits in this demo).
    pub card: String,
    /// The amount in the currency's smallest unit.
    pub amount_cents: u64,
    /// ISO 4217 code, lower case.
    #[serde(default = "usd")]
    pub currency: String,
}

fn usd() -> String {
    "usd".to_owned()
}

/// `set_card_nickname`'s arguments.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NicknameArgs {
    /// The card (a token or the last four digits in this demo).
    pub card: String,
    /// The name to show for it.
    pub nickname: String,
}

/// What a charge returns.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The processor's charge id.
    pub charge_id: String,
    /// The amount charged.
    pub amount_cents: u64,
    /// The currency charged.
    pub currency: String,
    /// The idempotency reference the processor was given.
    pub reference: String,
}

/// `create_shipment`'s arguments.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShipmentArgs {
    /// The order this shipment fulfils: one shipment per order.
    pub order_id: String,
    /// Where to ship.
    pub address: String,
    /// e.g. "standard" or "express".
    pub service_level: String,
}

/// What a shipment returns.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Shipment {
    /// The carrier's tracking number.
    pub tracking_number: String,
    /// The order shipped.
    pub order_id: String,
    /// The service level booked.
    pub service_level: String,
    /// The idempotency reference the carrier was given.
    pub reference: String,
}

/// What the stub processor saw and did under one reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeCounts {
    /// Charge requests that arrived with this reference.
    pub requests: u32,
    /// Charges actually made for it: 0 while the first request is in
    /// flight, then 1. A repeated request gets the first one's outcome.
    pub charges: u32,
}

/// What the stub carrier saw and did under one reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShipmentCounts {
    /// Shipment requests that arrived with this reference.
    pub requests: u32,
    /// Shipments actually booked for it (at most 1).
    pub shipments: u32,
}

/// What the stub mailer or warehouse saw and did under one reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeliveryCounts {
    /// Requests that arrived (the follow-ons' runs of the follow-on, failed ones
    /// included).
    pub attempts: u32,
    /// What was actually delivered: the stub dedupes by the downstream key,
    /// so at most 1.
    pub deliveries: u32,
}

/// The receipt `charge_card` asks the follow-on dispatcher to mail.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReceiptMail {
    /// The processor's charge id.
    pub charge_id: String,
    /// The amount charged.
    pub amount_cents: u64,
    /// The currency charged.
    pub currency: String,
}

impl ReceiptMail {
    pub(super) fn of(receipt: &Receipt) -> Self {
        ReceiptMail {
            charge_id: receipt.charge_id.clone(),
            amount_cents: receipt.amount_cents,
            currency: receipt.currency.clone(),
        }
    }
}

/// The notice `create_shipment` asks the follow-on dispatcher to send the warehouse.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WarehouseNotice {
    /// The order to pick and pack.
    pub order_id: String,
    /// The carrier's tracking number.
    pub tracking_number: String,
}

/// What the stub processor, carrier, mailer and warehouse were asked to do
/// and really did, per reference: a retry that got past idem shows as a
/// second request, and a double charge (which the stubs' own deduplication
/// prevents) as a second charge; a receipt the follow-on dispatcher ran three times shows
/// three attempts and one delivery.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LedgerView {
    /// Receipt requests and receipts mailed, by reference.
    pub mailer: BTreeMap<String, DeliveryCounts>,
    /// Warehouse notices requested and delivered, by reference.
    pub warehouse: BTreeMap<String, DeliveryCounts>,
    /// Total receipt requests that reached the mailer.
    pub mailer_attempts: u32,
    /// Total receipts mailed.
    pub mailer_deliveries: u32,
    /// Total notices that reached the warehouse.
    pub warehouse_attempts: u32,
    /// Total notices delivered.
    pub warehouse_deliveries: u32,
    /// Charge requests and charges made at the processor, by reference.
    pub processor: BTreeMap<String, ChargeCounts>,
    /// Shipment requests and shipments booked at the carrier, by reference.
    pub carrier: BTreeMap<String, ShipmentCounts>,
    /// Total charge requests that reached the processor.
    pub processor_requests: u32,
    /// Total charges the processor made.
    pub processor_charges: u32,
    /// Total shipment requests that reached the carrier.
    pub carrier_requests: u32,
    /// Total shipments the carrier booked.
    pub carrier_shipments: u32,
}

/// What the processor's lookup says about a reference.
#[derive(Clone, Debug)]
pub enum ChargeStatus {
    /// No request with this reference ever arrived.
    NotFound,
    /// A request arrived and its charge is still being processed.
    InFlight,
    /// The charge was made.
    Charged(Receipt),
}
