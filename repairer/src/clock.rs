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

/// Calls `tick` with the clock's time at every whole multiple of `period` (the first at the
/// next one), for as long as it returns true. Loops of one period tick together (the engine's and
/// the queue's: one wake-up a second, not two), and a tick that takes longer than the period
/// skips the multiples it missed rather than bunching them up.
pub async fn every(clock: SharedClock, period: Duration, mut tick: impl FnMut(u64) -> bool) {
    let period_ms = period.as_millis() as u64;
    loop {
        let now = clock.now_ms();
        clock.sleep(Duration::from_millis(next_multiple(now, period_ms) - now)).await;
        if !tick(clock.now_ms()) {
            return;
        }
    }
}

#[derive(Debug, Default)]
struct VirtualState {
    now_ms: u64,
    next_id: u64,
    /// (deadline, id) → the sleeper to wake.
    sleepers: BTreeMap<(u64, u64), oneshot::Sender<()>>,
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
        // Sleepers whose futures were dropped (a select that took the other branch) no longer
        // count.
        state.sleepers.retain(|_, wake| !wake.is_closed());
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
            tokio::spawn(every(shared.clone(), Duration::from_secs(1), move |now| {
                ticks.lock().unwrap().push((name, now));
                now < 12_000
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
