//! The rounds that keep records honest over time: purge, sweep, reconcile.

mod by_hand;
mod reconcile;
mod rounds;
mod runner;
mod settle;

pub use by_hand::{resolve_by_hand, ResolveError};
pub use reconcile::{
    reconcile, reconcile_with, Outcome, ReconcileConfig, ReconcileReport, Reconciler,
    Reconciliation,
};
pub use rounds::{purge, sweep};
pub use runner::{Maintenance, MaintenanceConfig, RoundReport};
pub use settle::SettleClock;
