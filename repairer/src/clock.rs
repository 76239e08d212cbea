//! The one clock the repairer's decisions and waits read: the engine, the workflow driver, the job
//! queue, the alert outbox and the tick loops take a [`Clock`] instead of reading the system's time
//! or sleeping on tokio's timer themselves.
//!
//! Production runs on [`SystemClock`] (wall-clock milliseconds, tokio's timer). Tests and the fleet
//! simulator run on a [`VirtualClock`], whose time moves only when it is told to and whose sleepers
//! wake the moment it passes their deadline: a day of repairs takes no real time, and the next
//! timer of every sleeping task is known ([`VirtualClock::next_deadline`]), so a discrete-event
//! simulation can jump straight to it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

/// A boxed future, so a clock can be used as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where the repairer's time comes from.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Unix time in milliseconds.
    fn now_ms(&self) -> u64;
    /// Completes once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// The clock every part of one repairer shares.
pub type SharedClock = Arc<dyn Clock>;

/// Unix time in milliseconds, from the system clock: for what stands outside the repairer's
/// decisions (tests' reports, the local fleet's view). The repairer itself asks its [`Clock`].
pub fn unix_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The system's wall clock and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        unix_now_ms()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// `future`'s output, or `Err(Elapsed)` once `limit` has passed on `clock`.
pub async fn timeout<T>(
    clock: &dyn Clock,
    limit: Duration,
    future: impl Future<Output = T>,
) -> Result<T, Elapsed> {
    // Biased: an answer that came with the deadline counts, and the same run decides the same
    // way every time (a simulation with a seed is reproducible).
    tokio::select! {
        biased;
        value = future => Ok(value),
        () = clock.sleep(limit) => Err(Elapsed(limit)),
    }
}

/// A wait on a [`Clock`] ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct Elapsed(pub Duration);

/// The first whole multiple of `period_ms` after `now_ms`. Periodic work of one period that
/// waits for it (ticks, workflow polls) falls on the same instants: one wake-up for all of it,
/// not one per task at its own phase.
pub fn next_multiple(now_ms: u64, period_ms: u64) -> u64 {
    let period_ms = period_ms.max(1);
    (now_ms / period_ms + 1) * period_ms
}

/// What a loop of time-based work does after a pass ([`when_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Look again at this time (unix ms), or sooner if woken: the earliest moment at which a
    /// pass could find something to do that it did not find now.
    At(u64),
    /// Nothing comes due with time alone: sleep until woken.
    Idle,
    /// End the loop.
    Stop,
}

/// The first whole multiple of `period_ms` at or after `at_ms`.
fn multiple_at_or_after(at_ms: u64, period_ms: u64) -> u64 {
    let period_ms = period_ms.max(1);
    at_ms.div_ceil(period_ms).saturating_mul(period_ms)
}

/// Runs `pass` with the clock's time on the whole multiples of `period` at which something is
/// due, not on every one: after each pass, at the first multiple at or after the time it says
/// ([`Next::At`]), and at the first multiple after `wake` is raised (new input that may make work
/// due: a report that changed a node, a job's progress). A fleet where nothing happens costs no
/// passes; where something does, each pass falls where a pass on every multiple would have
/// found it, so the same inputs lead to the same work at the same times. Loops of one period
/// fall on the same instants (one wake-up for all), and a pass that takes longer than the
/// period skips the multiples it missed rather than bunching them up.
///
/// `wake` is raised with `notify_one`: raised while a pass runs, it is kept for the next wait.
pub async fn when_due(
    clock: SharedClock,
    period: Duration,
    wake: Arc<tokio::sync::Notify>,
    mut pass: impl FnMut(u64) -> Next,
) {
    let period_ms = (period.as_millis() as u64).max(1);
    let mut at = Some(next_multiple(clock.now_ms(), period_ms));
    // Woken on a multiple this loop has not passed at yet (another loop's pass at that instant
    // changed something), it passes at once, as it would have on every multiple. It starts as
    // if it had passed at its start: its first multiple is the next one.
    let mut passed: Option<u64> = Some(clock.now_ms());
    let woken_at = |now: u64, passed: Option<u64>| {
        let at = multiple_at_or_after(now, period_ms);
        if Some(at) == passed { next_multiple(now, period_ms) } else { at }
    };
    loop {
        loop {
            let now = clock.now_ms();
            match at {
                Some(due) if due <= now => break,
                Some(due) => {
                    tokio::select! {
                        biased;
                        () = clock.sleep(Duration::from_millis(due - now)) => {}
                        () = wake.notified() => {
                            at = Some(due.min(woken_at(clock.now_ms(), passed)));
                        }
                    }
                }
                None => {
                    wake.notified().await;
                    at = Some(woken_at(clock.now_ms(), passed));
                }
            }
        }
        let now = clock.now_ms();
        passed = Some(now);
        at = match pass(now) {
            Next::Stop => return,
            Next::Idle => None,
            Next::At(due) => {
                Some(multiple_at_or_after(due, period_ms).max(next_multiple(now, period_ms)))
            }
        };
    }
}

/// The earliest of several instants after `now_ms` at which something may come due: what a
/// pass of [`when_due`] returns.
#[derive(Debug, Clone, Copy)]
pub struct Earliest {
    now_ms: u64,
    at: Option<u64>,
}

impl Earliest {
    /// None yet, at `now_ms`.
    pub fn after(now_ms: u64) -> Earliest {
        Earliest { now_ms, at: None }
    }

    /// Something may come due at `at_ms` (one at or before now: at once).
    pub fn add(&mut self, at_ms: u64) {
        self.at = Some(self.at.map_or(at_ms, |at| at.min(at_ms)));
    }

    /// Something may come due at `at_ms` if it is later than now (the instant a condition over
    /// time turns; one already past changes nothing more).
    pub fn add_later(&mut self, at_ms: u64) {
        if at_ms > self.now_ms {
            self.add(at_ms);
        }
    }

    /// Adds another's earliest.
    pub fn merge(&mut self, other: Option<u64>) {
        if let Some(at) = other {
            self.add(at);
        }
    }

    /// With another's earliest added.
    pub fn with(mut self, other: Option<u64>) -> Earliest {
        self.merge(other);
        self
    }

    pub fn earliest(self) -> Option<u64> {
        self.at
    }

    /// The pass's answer: look again then, or only when woken.
    pub fn next(self) -> Next {
        self.at.map_or(Next::Idle, Next::At)
    }
}

#[derive(Debug, Default)]
struct VirtualState {
    now_ms: u64,
    next_id: u64,
    /// (deadline, id) → the sleeper to wake.
    sleepers: BTreeMap<(u64, u64), oneshot::Sender<()>>,
    /// Sleepers at the last sweep of the dropped ones: the next sweep comes when they double.
    swept_at: usize,
}

impl VirtualState {
    /// Forgets the sleepers whose futures were dropped (a select that took the other branch):
    /// those at the front at once, the rest in a sweep each time the sleepers double, so a
    /// look at the next deadline costs no pass over every sleeper.
    fn forget_dropped(&mut self) {
        if self.sleepers.len() > 2 * self.swept_at + 64 {
            self.sleepers.retain(|_, wake| !wake.is_closed());
            self.swept_at = self.sleepers.len();
        }
        while let Some(entry) = self.sleepers.first_entry()
            && entry.get().is_closed()
        {
            entry.remove();
        }
    }
}

/// A clock that moves only when told to; its sleepers wake as soon as it passes their deadlines.
#[derive(Debug, Default)]
pub struct VirtualClock {
    state: Mutex<VirtualState>,
}

impl VirtualClock {
    /// A virtual clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Arc<VirtualClock> {
        Arc::new(VirtualClock {
            state: Mutex::new(VirtualState { now_ms: start_ms, ..VirtualState::default() }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, VirtualState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the clock on by `by`, waking every sleeper whose deadline it reaches.
    pub fn advance(&self, by: Duration) {
        let to = self.lock().now_ms.saturating_add(by.as_millis() as u64);
        self.advance_to(to);
    }

    /// Moves the clock to `to_ms` (never backwards), waking every sleeper due by then.
    pub fn advance_to(&self, to_ms: u64) {
        let due = {
            let mut state = self.lock();
            state.now_ms = state.now_ms.max(to_ms);
            let first_later = (state.now_ms.saturating_add(1), 0);
            let later = state.sleepers.split_off(&first_later);
            std::mem::replace(&mut state.sleepers, later)
        };
        // Woken outside the lock: a woken task may sleep again at once.
        for (_, wake) in due {
            let _ = wake.send(());
        }
    }

    /// The earliest deadline of a live sleeper, if any: where a discrete-event simulation jumps.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut state = self.lock();
        state.forget_dropped();
        state.sleepers.keys().next().map(|(deadline, _)| *deadline)
    }

    /// How many live sleepers wait on this clock.
    pub fn sleepers(&self) -> usize {
        let mut state = self.lock();
        state.sleepers.retain(|_, wake| !wake.is_closed());
        state.sleepers.len()
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.lock().now_ms
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let (wake, woken) = oneshot::channel();
        {
            let mut state = self.lock();
            let deadline = state.now_ms.saturating_add(duration.as_millis() as u64);
            if duration.is_zero() {
                return Box::pin(std::future::ready(()));
            }
            let id = state.next_id;
            state.next_id += 1;
            state.sleepers.insert((deadline, id), wake);
        }
        Box::pin(async move {
            // A dropped clock wakes its sleepers rather than leaving them hanging.
            let _ = woken.await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_virtual_sleeper_wakes_when_the_clock_passes_its_deadline_and_not_before() {
        let clock = VirtualClock::new(1_000);
        let sleeping = tokio::spawn(clock.sleep(Duration::from_secs(10)));
        assert_eq!(clock.next_deadline(), Some(11_000));
        clock.advance(Duration::from_millis(9_999));
        tokio::task::yield_now().await;
        assert!(!sleeping.is_finished(), "woke before its deadline");
        clock.advance(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(5), sleeping)
            .await
            .expect("the sleeper wakes at its deadline")
            .expect("the sleeper's task ends");
        assert_eq!(clock.now_ms(), 11_000);
        assert_eq!(clock.next_deadline(), None);
    }

    #[tokio::test]
    async fn timeout_on_a_virtual_clock_runs_out_only_when_the_clock_moves() {
        let clock = VirtualClock::new(0);
        let waiting = {
            let clock = clock.clone();
            tokio::spawn(async move {
                timeout(&*clock, Duration::from_secs(30), std::future::pending::<()>()).await
            })
        };
        while clock.sleepers() == 0 {
            tokio::task::yield_now().await;
        }
        clock.advance_to(30_000);
        let result = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!(result, Err(Elapsed(Duration::from_secs(30))));
        let ready = timeout(&*clock, Duration::from_secs(1), async { 7 }).await;
        assert_eq!(ready, Ok(7));
    }

    #[tokio::test]
    async fn loops_of_one_period_tick_together_on_its_whole_multiples() {
        let clock = VirtualClock::new(10_250);
        let ticks = Arc::new(Mutex::new(Vec::new()));
        let shared: SharedClock = clock.clone();
        let spawn_loop = |name: &'static str| {
            let ticks = ticks.clone();
            let wake = Arc::new(tokio::sync::Notify::new());
            tokio::spawn(when_due(shared.clone(), Duration::from_secs(1), wake, move |now| {
                ticks.lock().unwrap().push((name, now));
                if now < 12_000 { Next::At(now + 1) } else { Next::Stop }
            }))
        };
        let first = spawn_loop("first");
        while clock.sleepers() < 1 {
            tokio::task::yield_now().await;
        }
        clock.advance_to(10_600);
        let second = spawn_loop("second");
        while clock.sleepers() < 2 {
            tokio::task::yield_now().await;
        }
        // Both wait for 11 000: one deadline, one wake-up for the two.
        assert_eq!(clock.next_deadline(), Some(11_000));
        for to in [11_000, 12_000] {
            clock.advance_to(to);
            while ticks.lock().unwrap().iter().filter(|(_, at)| *at == to).count() < 2 {
                tokio::task::yield_now().await;
            }
        }
        for task in [first, second] {
            tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
        }
        let mut seen = ticks.lock().unwrap().clone();
        seen.sort();
        assert_eq!(
            seen,
            [("first", 11_000), ("first", 12_000), ("second", 11_000), ("second", 12_000)]
        );
    }

    /// Waits until `clock` has `n` live sleepers.
    async fn sleepers(clock: &VirtualClock, n: usize) {
        while clock.sleepers() != n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_loop_passes_only_when_something_is_due_or_it_is_woken() {
        let clock = VirtualClock::new(1_000);
        let shared: SharedClock = clock.clone();
        let passes = Arc::new(Mutex::new(Vec::new()));
        let wake = Arc::new(tokio::sync::Notify::new());
        let seen = passes.clone();
        let task =
            tokio::spawn(when_due(shared, Duration::from_secs(1), wake.clone(), move |now| {
                seen.lock().unwrap().push(now);
                match now {
                    // Something comes due at 5 500: looked at on the multiple after it.
                    2_000 => Next::At(5_500),
                    // Nothing comes due with time: only a wake brings the next pass.
                    6_000 => Next::Idle,
                    _ => Next::Stop,
                }
            }));
        sleepers(&clock, 1).await;
        assert_eq!(clock.next_deadline(), Some(2_000));
        clock.advance_to(2_000);
        while passes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        sleepers(&clock, 1).await;
        assert_eq!(clock.next_deadline(), Some(6_000), "passes skipped until due");
        clock.advance_to(6_000);
        while passes.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
        tokio::task::yield_now().await;
        assert_eq!(clock.next_deadline(), None, "idle: no timer at all");
        clock.advance_to(60_000);
        clock.advance_to(60_400);
        wake.notify_one();
        sleepers(&clock, 1).await;
        assert_eq!(clock.next_deadline(), Some(61_000), "woken: the next multiple");
        clock.advance_to(61_000);
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
        assert_eq!(*passes.lock().unwrap(), [2_000, 6_000, 61_000]);
    }

    #[test]
    fn the_clock_never_runs_backwards_and_dropped_sleepers_are_forgotten() {
        let clock = VirtualClock::new(5_000);
        clock.advance_to(1_000);
        assert_eq!(clock.now_ms(), 5_000);
        let sleep = clock.sleep(Duration::from_secs(1));
        assert_eq!(clock.sleepers(), 1);
        drop(sleep);
        assert_eq!(clock.sleepers(), 0);
        assert_eq!(clock.next_deadline(), None);
    }

    /// The modules that decide and wait read time only through the clock: a direct read of the
    /// system's time or tokio's timer there would not move with a virtual clock.
    #[test]
    fn decision_and_wait_code_reads_time_only_through_the_clock() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let forbidden = [
            "SystemTime::now",
            "Instant::now",
            "tokio::time::sleep",
            "tokio::time::interval",
            "tokio::time::timeout",
            "unix_now_ms",
        ];
        let mut files = Vec::new();
        for dir in ["engine", "workflow", "queue", "alerts", "allreduce"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
            files.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
        }
        // The OTLP exporter's flush and shutdown deadlines are I/O at the process's end, not
        // decisions; span times come from the workflow's own (clock) times.
        files.retain(|f| !f.ends_with("workflow/trace.rs"));
        files.extend(
            ["nodes.rs", "breaker.rs", "service.rs"]
                .iter()
                .map(|f| root.join(f))
                .filter(|p| p.exists()),
        );
        assert!(files.len() >= 4, "the modules moved: {files:?}");
        let mut found = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            // Unit tests may use real time for their own waits.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for needle in forbidden {
                if code.contains(needle) {
                    found.push(format!("{}: {needle}", file.display()));
                }
            }
        }
        assert!(found.is_empty(), "time read outside the clock: {found:#?}");
    }
}
