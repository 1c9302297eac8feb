//! The reconciler: what became of an UNKNOWN charge, asked of the processor.

use async_trait::async_trait;
use idem_runtime::{
    follow_ons::FollowOn,
    maintenance::{Outcome, Reconciler, Reconciliation},
    store::Record,
};
use rmcp::handler::server::wrapper::Json;

use super::backends::Backends;
use super::model::{ChargeStatus, Receipt, ReceiptMail};

/// Resolves UNKNOWN operations by asking the processor what became of the
/// reference: charged (the stored response is the receipt, as the tool would
/// have returned it), still in flight (ask again later), or never seen (not
/// performed, which idem trusts only once the record has settled). The
/// carrier has no lookup, so a shipment stays UNKNOWN for an operator; any
/// other tool is not this reconciler's.
///
/// A charge found made gets its receipt follow-on written with the resolution
/// (the handler's declaration was lost with its outcome): every store idem
/// ships keeps follow-ons.
#[derive(Debug)]
pub struct ProcessorReconciler {
    /// The processor to ask.
    pub backends: Backends,
}

#[async_trait]
impl Reconciler for ProcessorReconciler {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match record.tool.as_str() {
            "charge_card" | "tap_to_pay" => {
                match self
                    .backends
                    .charge_status(&record.reference.to_string())
                    .await?
                {
                    // The handler's receipt follow-on was lost with its outcome: the
                    // resolution writes it.
                    ChargeStatus::Charged(receipt) => {
                        let mail = FollowOn::new("send_receipt", &ReceiptMail::of(&receipt))?;
                        Reconciliation::Found(Outcome::completed_with(
                            tool_response(receipt)?,
                            vec![mail],
                        ))
                    }
                    ChargeStatus::InFlight => Reconciliation::StillUnknown,
                    ChargeStatus::NotFound => Reconciliation::not_performed(),
                }
            }
            // The carrier dedups by reference but offers no lookup: only an
            // operator can resolve a shipment (`resolve_by_hand`).
            "create_shipment" => Reconciliation::StillUnknown,
            _ => Reconciliation::NotMine,
        })
    }
}

/// Exactly what `charge_card` stores for `receipt` (it returns
/// `Json<Receipt>`), so a repeat replays the receipt as the tool would.
fn tool_response(receipt: Receipt) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    Ok(idem_runtime::mcp::stored_response(Json(receipt))?)
}
