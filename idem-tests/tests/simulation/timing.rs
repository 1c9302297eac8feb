//! Every duration of a schedule, for simulated (paused) time and for real
//! time against the durable stores.

use std::time::Duration;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The schedule's clock: tokio's paused clock (simulated minutes are free and
/// a seed replays exactly) or the real one (the durable stores read their own
/// clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Paused,
    Real,
}

/// The knobs of one schedule. The processor's bounds are those of a
/// correctly configured deployment: a request sent is visible to the lookup
/// within `arrive_max + latency.1 + lag_max`, which is at most `settle`, and
/// a handler sends its request before its lease can run out (`prework_max <
/// lease`). Under these bounds the library must keep every guarantee; the
/// sabotage switches break them on purpose.
#[derive(Clone, Debug)]
pub struct Timing {
    pub mode: Mode,
    /// The executor's lease (heartbeat every third of it).
    pub lease: Duration,
    /// The executor's retention (UNKNOWN and IN_PROGRESS records, business
    /// keys without their own).
    pub retention: Duration,
    /// The windows of the window-scoped tools: one shorter than a slow
    /// handler runs (its record completes after its window ended).
    pub windows: [Duration; 3],
    /// A business-key tool's own retention, or the executor's.
    pub ship_retention: [Option<Duration>; 2],
    pub settle: Duration,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Records looked at per reconcile round: small, so records nobody can
    /// resolve would starve the others if they were not put off.
    pub reconcile_batch: usize,
    /// Time between maintenance rounds, plus up to `jitter`.
    pub interval: Duration,
    pub jitter: Duration,
    /// Network delay before a request reaches the processor.
    pub arrive_max: Duration,
    /// Processing time of a short request and of a slow one.
    pub latency_short: (Duration, Duration),
    pub latency_long: (Duration, Duration),
    /// After landing, a charge shows in the lookup within this, and not
    /// before `lag_min`.
    pub lag_max: Duration,
    pub lag_min: Duration,
    /// Whether the processor's lookup shows a request that arrived and has
    /// not landed yet as not found (as a processor without a "processing"
    /// state does), rather than as still unknown.
    pub hides_in_flight: bool,
    /// Whether BUGGIFY's `ClaimAnswer` is always on, with answers after the
    /// first heartbeat was due and before the lease ran out.
    pub slow_claims: bool,
    /// The share of calls whose future is dropped mid-flight.
    pub cancel_rate: f64,
    /// The share of requests that take `latency_long`.
    pub long_rate: f64,
    /// The handler's own timeout against the processor.
    pub handler_timeout: (Duration, Duration),
    /// Work before the request is sent.
    pub prework_max: Duration,
    /// Work after the processor answered (a handler that outlives its lease).
    pub postwork: (Duration, Duration),
    /// A call future dropped after at most this.
    pub cancel_max: Duration,
    /// Calls are made within this span.
    pub horizon: Duration,
    /// How many calls a schedule plans (retries come on top).
    pub calls: (u64, u64),
    /// How many purchases a schedule repeats after their window (the same
    /// arguments again, a new operation the user wants).
    pub repeats: (u64, u64),
    /// How long after the first call's window a repeat comes.
    pub repeat_gap: (Duration, Duration),
    /// Oracle 8's margin: a call counts as made after its operation's window
    /// only this long after the window ended by the store's clock (a call
    /// at the edge may legitimately be either).
    pub window_margin: Duration,
    /// How long the processor keeps an idempotency key, from the arrival of
    /// the request that created it (Stripe: 24 hours).
    pub processor_keeps_keys: Duration,
    /// How long a delayed store call waits.
    pub store_delay_max: Duration,
    /// A period during which every heartbeat fails.
    pub outage: (Duration, Duration),
    /// A period during which every store call fails.
    pub store_outage: (Duration, Duration),
    /// How often the operator looks for records to resolve by hand.
    pub operator_every: (Duration, Duration),
    /// Slack on the reconciliation bound (scheduling, in real time).
    pub slack: Duration,
    /// Tolerance of clock comparisons between the harness's model and the
    /// store (0 on the paused clock, where they read the same clock).
    pub tolerance: Duration,
    /// The follow-on dispatcher: the longest run of one job (its lease is twice this).
    pub job_timeout: Duration,
    /// Time between two dispatch rounds of one replica, plus up to `jitter`.
    pub dispatch_every: Duration,
    /// How long the mailer takes to answer.
    pub mailer_latency: (Duration, Duration),
}

impl Timing {
    /// Simulated time: seconds of store time cost nothing.
    pub fn paused() -> Self {
        Timing {
            mode: Mode::Paused,
            lease: ms(2_000),
            retention: ms(45_000),
            windows: [ms(15_000), ms(30_000), ms(3_000)],
            ship_retention: [Some(ms(20_000)), None],
            settle: ms(5_000),
            first_backoff: ms(1_000),
            max_backoff: ms(12_000),
            reconcile_batch: 2,
            interval: ms(2_500),
            jitter: ms(500),
            arrive_max: ms(300),
            latency_short: (ms(50), ms(1_000)),
            latency_long: (ms(1_000), ms(3_500)),
            lag_max: ms(1_100),
            lag_min: Duration::ZERO,
            hides_in_flight: false,
            slow_claims: false,
            cancel_rate: 0.12,
            long_rate: 0.3,
            handler_timeout: (ms(1_000), ms(2_500)),
            prework_max: ms(1_000),
            postwork: (ms(500), ms(4_000)),
            cancel_max: ms(4_000),
            horizon: ms(60_000),
            calls: (20, 40),
            repeats: (1, 3),
            repeat_gap: (ms(500), ms(8_000)),
            window_margin: ms(250),
            processor_keeps_keys: Duration::from_secs(24 * 3600),
            store_delay_max: ms(300),
            outage: (ms(3_000), ms(10_000)),
            store_outage: (ms(1_000), ms(6_000)),
            operator_every: (ms(5_000), ms(15_000)),
            slack: ms(1_000),
            tolerance: Duration::ZERO,
            job_timeout: ms(1_000),
            dispatch_every: ms(2_000),
            mailer_latency: (ms(10), ms(400)),
        }
    }

    /// Real time, for the durable stores: short durations, fewer calls.
    pub fn real() -> Self {
        Timing {
            mode: Mode::Real,
            lease: ms(450),
            retention: ms(8_000),
            windows: [ms(2_500), ms(5_000), ms(400)],
            ship_retention: [Some(ms(3_000)), None],
            settle: ms(1_500),
            first_backoff: ms(150),
            max_backoff: ms(1_500),
            reconcile_batch: 2,
            interval: ms(150),
            jitter: ms(50),
            arrive_max: ms(40),
            latency_short: (ms(10), ms(150)),
            latency_long: (ms(150), ms(550)),
            lag_max: ms(250),
            lag_min: Duration::ZERO,
            hides_in_flight: false,
            slow_claims: false,
            cancel_rate: 0.12,
            long_rate: 0.3,
            handler_timeout: (ms(150), ms(350)),
            prework_max: ms(120),
            postwork: (ms(100), ms(800)),
            cancel_max: ms(500),
            horizon: ms(3_500),
            calls: (12, 20),
            repeats: (1, 3),
            repeat_gap: (ms(150), ms(700)),
            window_margin: ms(100),
            processor_keeps_keys: Duration::from_secs(24 * 3600),
            store_delay_max: ms(40),
            outage: (ms(500), ms(1_200)),
            store_outage: (ms(100), ms(600)),
            operator_every: (ms(500), ms(1_200)),
            slack: ms(2_000),
            tolerance: ms(25),
            job_timeout: ms(150),
            dispatch_every: ms(150),
            mailer_latency: (ms(2), ms(40)),
        }
    }

    /// Checks the bounds the guarantees rest on (see the type's doc).
    pub fn assert_consistent(&self) {
        assert!(
            self.arrive_max + self.latency_long.1 + self.lag_max <= self.settle,
            "a request must be visible within the settle period"
        );
        assert!(
            self.prework_max < self.lease,
            "a handler sends before its lease can lapse"
        );
        assert!(
            self.prework_max + self.handler_timeout.1 <= self.settle,
            "settle covers the longest handler timeout"
        );
        assert!(
            self.store_delay_max * 3 < self.lease,
            "a delayed heartbeat still lands in time"
        );
        assert!(
            self.windows.iter().all(|w| *w < self.processor_keeps_keys)
                && self.horizon + self.retention < self.processor_keeps_keys,
            "a repeat after its window reaches the processor while it still holds the first request's key"
        );
        assert!(
            self.mailer_latency.1 < self.job_timeout,
            "a mailer on time answers within a job's run"
        );
        assert!(
            self.window_margin > self.tolerance * 2,
            "oracle 8's margin covers the clocks' disagreement"
        );
    }

    /// How long after the processor became consistent every UNKNOWN record
    /// a reconciler can resolve must be resolved: it waits out its settle
    /// period or its backoff (at most `max_backoff`), a lapsed lease is swept
    /// within a round once the sweep's marks reach the store (in real time
    /// BUGGIFY's `SweepMarkLost` keeps them from it for two leases), and a
    /// round comes within `interval + jitter`.
    pub fn reconcile_bound(&self) -> Duration {
        let marks_lost = match self.mode {
            Mode::Real => self.lease * 2,
            _ => Duration::ZERO,
        };
        self.settle.max(self.max_backoff)
            + self.lease
            + marks_lost
            + 2 * (self.interval + self.jitter)
            + self.slack
    }
}
