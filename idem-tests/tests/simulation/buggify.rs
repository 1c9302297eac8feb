//! BUGGIFY (after FoundationDB's): injected delays at the await points
//! between a read and the action taken on it, where a race hides.
//!
//! Each point is switched on for a schedule with some probability, and an
//! enabled point fires on a share of its calls, with a delay drawn relative
//! to the lease (or the settle period, or the retention), so one schedule
//! stresses a few windows hard instead of every window a little. In real
//! time (SQLite, PostgreSQL: a few hundred schedules a run, not tens of
//! thousands) `HeartbeatLate`, `HeartbeatDetached` and `SweepMark` are
//! always on and fire on half their calls, so the sweep's race with a
//! heartbeat comes up. The
//! decisions come from a generator of their own, seeded from the schedule's
//! seed: with `IDEM_SIM_BUGGIFY=0` a schedule draws exactly what it drew
//! before BUGGIFY existed, and with it on a seed still replays exactly.
//!
//! The points, where the race is and what injection does there:
//!
//! - `ClaimAnswer`: between a claim's send and its answer. The claim takes
//!   effect at once, its answer comes up to three leases later (the late
//!   claim, and the first heartbeat counted from the claim's send); in a
//!   tight schedule it is always on, and the answer comes after the first
//!   heartbeat was due and before the lease ran out (a replica ahead may
//!   sweep the claim before its answer: the claim's confirmation).
//! - `HeartbeatLate`: before a heartbeat reaches the store: it lands up to
//!   two leases late, so the lease may lapse under a live handler (the
//!   sweep then races the heartbeat).
//! - `HeartbeatAnswer`: a heartbeat that took effect answers late, holding
//!   back the next one.
//! - `HeartbeatDetached`: a heartbeat on the wire lands up to three leases
//!   later even if its caller gave up (the handler ended): by then the
//!   record may be another attempt's, and the store must fence it.
//! - `SweepMark`: between the sweep's list and its mark (a heartbeat may
//!   land in between: the mark must re-check the lease).
//! - `SweepMarkLost` (real time only): the store is unreachable for the
//!   sweep's marks, after its list, for two leases: a lapsed claim the
//!   sweep listed and could not mark must be listed again once it can. Drawn from a generator of its own, so
//!   the other points draw what they drew before it.
//! - `ClaimLandsLate`: a claim's caller gives up (its client's timeout, up
//!   to half a lease) and the store applies the claim later anyway, within
//!   the claim's lease of its send (a statement that waited on a lock, a
//!   script in the server's buffer, a request whose answer was lost): the
//!   caller was told nothing ran, so the claim must be retracted. On in
//!   half the schedules, from a generator of its own.
//! - `ReconcileTake`: between a reconcile's listing and its take of the
//!   record's check: the other replica may list, take and ask meanwhile,
//!   and the take must then find the check held.
//! - `ReconcileWrite`: between a reconcile's lookup and its resolve or
//!   deferral (`Resolve`, `DeferCheck`), up to twice the settle period:
//!   past the check's hold, so another replica may have taken the next
//!   check and be asking when the late deferral lands.
//! - `ReconcilerAnswer`: inside the reconciler, between its lookup at the
//!   processor and its answer (the answer describes the past by then).
//! - `RecordWrite`: a completion, release or unknown mark stalled on its
//!   way to the store, up to a retention and a half (a stalled connection):
//!   it lands after the record lapsed, was resolved, expired or taken over.
//! - `JobLease`: a job lease's answer comes late, up to a job lease.
//! - `JobFinish`: between a job's run and its finish, retry or bury, up to
//!   two job leases (the lease may run out and another dispatcher run it).
//! - `Mailer`: the mailer answers late, past the job's run timeout.
//! - `ClaimRead` (PostgreSQL, a hook inside the store): between the claim's
//!   insert, which found a live record, and its read of that record.
//! - `CompletionLost`: a store crash loses a completion it had acknowledged
//!   (a relaxed commit not yet flushed, what `synchronous_commit = off` and
//!   SQLite's `synchronous = NORMAL` may lose): the record stays IN_PROGRESS
//!   while the caller holds its result.

use std::time::Duration;

use idem_runtime::store::conformance::{Call, Fault};

use super::rng::Rng;
use super::timing::{Mode, Timing};

/// A place where BUGGIFY may inject a delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Point {
    ClaimAnswer,
    HeartbeatLate,
    HeartbeatAnswer,
    HeartbeatDetached,
    SweepMark,
    ReconcileTake,
    ReconcileWrite,
    ReconcilerAnswer,
    RecordWrite,
    JobLease,
    JobFinish,
    Mailer,
    ClaimRead,
    CompletionLost,
    SweepMarkLost,
    ClaimLandsLate,
}

impl Point {
    pub const ALL: [Point; 14] = [
        Point::ClaimAnswer,
        Point::HeartbeatLate,
        Point::HeartbeatAnswer,
        Point::HeartbeatDetached,
        Point::SweepMark,
        Point::ReconcileTake,
        Point::ReconcileWrite,
        Point::ReconcilerAnswer,
        Point::RecordWrite,
        Point::JobLease,
        Point::JobFinish,
        Point::Mailer,
        Point::ClaimRead,
        Point::CompletionLost,
    ];

    /// How often an enabled point fires, and (for the coverage line) its
    /// name.
    fn rate(self) -> f64 {
        match self {
            // A stalled write waits up to a retention and a half: rare, or
            // schedules would mostly wait.
            Point::RecordWrite => 0.05,
            _ => 0.25,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Point::ClaimAnswer => "buggify: claim answered late",
            Point::HeartbeatLate => "buggify: heartbeat landed late",
            Point::HeartbeatAnswer => "buggify: heartbeat answered late",
            Point::HeartbeatDetached => "buggify: heartbeat landed after its caller left",
            Point::SweepMark => "buggify: sweep's mark delayed",
            Point::ReconcileTake => "buggify: reconcile's take delayed",
            Point::ReconcileWrite => "buggify: reconcile's write delayed",
            Point::ReconcilerAnswer => "buggify: reconciler answered late",
            Point::RecordWrite => "buggify: record write stalled",
            Point::JobLease => "buggify: job lease answered late",
            Point::JobFinish => "buggify: job finish delayed",
            Point::Mailer => "buggify: mailer answered late",
            Point::ClaimRead => "buggify: claim's read delayed",
            Point::CompletionLost => "buggify: acknowledged completion lost in a store crash",
            Point::SweepMarkLost => "buggify: store unreachable at the sweep's mark",
            Point::ClaimLandsLate => "buggify: claim landed after its caller gave up",
        }
    }
}

/// Whether BUGGIFY is on (`IDEM_SIM_BUGGIFY`, default on).
pub fn enabled_by_env() -> bool {
    std::env::var("IDEM_SIM_BUGGIFY").map_or(true, |v| v.trim() != "0")
}

/// One schedule's BUGGIFY: which points are on, and the generator of its
/// decisions.
#[derive(Debug)]
pub struct Buggify {
    rng: Rng,
    on: Vec<Point>,
    /// Points that fire on half their calls: in real time, where a run has
    /// a few hundred schedules, not ten thousand, the sweep's race with a
    /// heartbeat (a late heartbeat landing between the sweep's list and its
    /// delayed mark) needs both points on and firing often.
    hot: Vec<Point>,
    /// `SweepMarkLost`'s generator, when it is on (real time).
    lost: Option<Rng>,
    /// Until when the sweep's marks find the store unreachable.
    lost_until: Option<std::time::Instant>,
    /// `ClaimLandsLate`'s generator, when it is on.
    late: Option<Rng>,
}

impl Buggify {
    /// The points on for the schedule of `seed` (none when `enabled` is
    /// false): each with probability one half.
    pub fn new(seed: u64, enabled: bool, mode: Mode) -> Self {
        let mut rng = Rng::new(seed ^ 0xB0_66_1F_7E_u64.rotate_left(40));
        let mut on: Vec<Point> = if enabled {
            Point::ALL
                .iter()
                .copied()
                .filter(|_| rng.chance(0.5))
                .collect()
        } else {
            Vec::new()
        };
        let mut hot = Vec::new();
        if enabled && mode == Mode::Real {
            for point in [
                Point::HeartbeatLate,
                Point::HeartbeatDetached,
                Point::SweepMark,
            ] {
                if !on.contains(&point) {
                    on.push(point);
                }
                hot.push(point);
            }
        }
        let lost = (enabled && mode == Mode::Real)
            .then(|| Rng::new(seed ^ 0x5EE9_0057_u64.rotate_left(24)));
        let late = enabled
            .then(|| Rng::new(seed ^ 0x1A7E_C1A1_u64.rotate_left(32)))
            .and_then(|mut rng| rng.chance(0.5).then_some(rng));
        Buggify {
            rng,
            on,
            hot,
            lost,
            lost_until: None,
            late,
        }
    }

    pub fn is_on(&self, point: Point) -> bool {
        self.on.contains(&point)
    }

    /// Whether the sweep's mark finds the store unreachable now: within an
    /// outage of the marks, or at the start of one (half the marks start
    /// one, `span` long), so that rounds go on listing while the marks
    /// fail.
    fn mark_lost(&mut self, span: Duration) -> bool {
        let Some(rng) = self.lost.as_mut() else {
            return false;
        };
        let now = std::time::Instant::now();
        if self.lost_until.is_some_and(|until| now < until) {
            return true;
        }
        let starts = rng.chance(0.5);
        if starts {
            self.lost_until = Some(now + span);
        }
        starts
    }

    /// A claim given up on by its caller, landing later (`ClaimLandsLate`),
    /// when the point is on and fires: the caller is answered within half
    /// a lease, and the claim lands after that, within its lease of the
    /// send.
    fn lands_late(&mut self, lease: Duration) -> Option<Fault> {
        let rng = self.late.as_mut()?;
        if !rng.chance(0.15) {
            return None;
        }
        let gave_up = rng.between(Duration::ZERO, lease / 2);
        let lands = rng.between(gave_up, lease * 19 / 20);
        Some(Fault::LandsLate { gave_up, lands })
    }

    /// Whether `point` fires now.
    pub fn fires(&mut self, point: Point) -> bool {
        let rate = if self.hot.contains(&point) {
            0.5
        } else {
            point.rate()
        };
        self.is_on(point) && self.rng.chance(rate)
    }

    /// A delay uniform in `lo..=hi`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        self.rng.between(lo, hi)
    }

    /// The fault BUGGIFY injects into a store call, if any, and the point
    /// that fired.
    pub fn fault(&mut self, call: Call, t: &Timing) -> Option<(Point, Fault)> {
        let lease = t.lease;
        let zero = Duration::ZERO;
        let point = match call {
            Call::Claim => match self.lands_late(lease) {
                Some(fault) => return Some((Point::ClaimLandsLate, fault)),
                None => Point::ClaimAnswer,
            },
            Call::Heartbeat if self.is_on(Point::HeartbeatLate) => Point::HeartbeatLate,
            Call::Heartbeat => Point::HeartbeatAnswer,
            Call::MarkLapsed if self.mark_lost(lease * 2) => {
                return Some((Point::SweepMarkLost, Fault::Unreachable));
            }
            Call::MarkLapsed => Point::SweepMark,
            Call::Complete | Call::CompleteWithFollowOns if self.fires(Point::CompletionLost) => {
                return Some((Point::CompletionLost, Fault::WriteLost));
            }
            Call::TakeCheck => Point::ReconcileTake,
            Call::Resolve | Call::DeferCheck => Point::ReconcileWrite,
            Call::Complete | Call::CompleteWithFollowOns | Call::Release | Call::MarkUnknown => {
                Point::RecordWrite
            }
            Call::LeaseJobs => Point::JobLease,
            Call::FinishJob | Call::RetryJob | Call::BuryJob => Point::JobFinish,
            _ => return None,
        };
        // A tight schedule's claims are answered slowly but in time: after
        // their first heartbeat was due, before their lease ran out.
        let slow_claims = point == Point::ClaimAnswer && t.slow_claims;
        let fires = if slow_claims {
            self.rng.chance(point.rate())
        } else {
            self.fires(point)
        };
        if !fires {
            return None;
        }
        let fault = match point {
            Point::ClaimAnswer if slow_claims => {
                Fault::SlowAnswer(self.between(lease / 3, lease * 19 / 20))
            }
            Point::ClaimAnswer => Fault::SlowAnswer(self.between(zero, lease * 3)),
            Point::HeartbeatLate => Fault::Delay(self.between(lease / 3, lease * 2)),
            Point::HeartbeatAnswer => Fault::SlowAnswer(self.between(lease / 3, lease * 2)),
            Point::SweepMark => Fault::Delay(self.between(zero, lease * 2)),
            Point::ReconcileTake => Fault::Delay(self.between(zero, t.interval * 2)),
            Point::ReconcileWrite => Fault::Delay(self.between(zero, t.settle * 2)),
            Point::RecordWrite => Fault::Delay(self.between(lease, t.retention * 3 / 2)),
            Point::JobLease => Fault::SlowAnswer(self.between(zero, t.job_timeout * 2)),
            Point::JobFinish => Fault::Delay(self.between(zero, t.job_timeout * 4)),
            _ => return None,
        };
        Some((point, fault))
    }
}
