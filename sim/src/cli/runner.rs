//! Many simulations at once: on worker threads as the cores allow, their reports in the order
//! asked, with one progress bar over them all on stderr.

use std::io::IsTerminal;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::SimConfig;
use crate::report::SimReport;
use crate::run::{self, SimError};

/// Progress bar steps per simulation.
const STEPS_PER_RUN: u64 = 1_000;
/// Worker threads get the stack a main thread has (or more): a simulation runs the repairer's
/// futures on the thread that runs it, and unoptimised builds make those large.
const WORKER_STACK_BYTES: usize = 16 << 20;

/// The threads `runs` simulations take: one per core, no more than there are runs.
pub(super) fn threads_for(runs: usize) -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get).min(runs).max(1)
}

/// One simulation per config on up to `threads` threads: the reports in the configs' order, or
/// the first failure with its config's index.
pub(super) fn simulate_all(
    configs: &[SimConfig],
    threads: usize,
    bar: Option<&ProgressFeed>,
) -> Result<Vec<SimReport>, (usize, SimError)> {
    in_parallel(configs, threads, |index, config| match bar {
        Some(feed) => run::simulate(config, Some(&|share| feed.advance(index, share))),
        None => run::simulate(config, None),
    })
}

/// Runs `work` on each item on up to `threads` threads (this one among them) and gives the
/// results in the items' order, or the failure (of the earliest item among those that failed)
/// with the item's index. Once one fails no further item starts.
pub(super) fn in_parallel<T: Sync, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(usize, &T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, (usize, E)> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let worker = || {
        let mut done = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(index) else { break };
            let result = work(index, item);
            if result.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            done.push((index, result));
        }
        done
    };
    let mut slots: Vec<Option<Result<R, E>>> = items.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        // This thread is one of the workers: should no helper start, it does all the work.
        let helpers: Vec<_> = (1..threads.clamp(1, items.len().max(1)))
            .filter_map(|_| {
                std::thread::Builder::new()
                    .stack_size(WORKER_STACK_BYTES)
                    .spawn_scoped(scope, worker)
                    .ok()
            })
            .collect();
        let mut finished = vec![worker()];
        for helper in helpers {
            match helper.join() {
                Ok(done) => finished.push(done),
                // A simulation that panicked is a bug: let it surface as the panic it is.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (index, result) in finished.into_iter().flatten() {
            slots[index] = Some(result);
        }
    });
    let mut results = Vec::with_capacity(items.len());
    let mut first_failure = None;
    for (index, slot) in slots.into_iter().enumerate() {
        match slot {
            Some(Ok(result)) => results.push(result),
            Some(Err(err)) => {
                first_failure.get_or_insert((index, err));
            }
            None => {}
        }
    }
    match first_failure {
        Some(failure) => Err(failure),
        None => Ok(results),
    }
}

/// A progress bar over `runs` simulations, each fed its share of simulated time done.
pub(super) struct ProgressFeed {
    bar: ProgressBar,
    /// Steps each run has reported so far.
    steps: Vec<AtomicU64>,
}

impl ProgressFeed {
    pub(super) fn advance(&self, run: usize, share: f64) {
        let Some(steps) = self.steps.get(run) else { return };
        let now = (share.clamp(0.0, 1.0) * STEPS_PER_RUN as f64) as u64;
        let before = steps.fetch_max(now, Ordering::Relaxed);
        if now > before {
            self.bar.inc(now - before);
        }
    }

    /// Takes the bar off the terminal.
    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A bar on stderr when stderr is a terminal; none otherwise (logs, pipes, CI).
pub(super) fn progress_bar(runs: usize) -> Option<ProgressFeed> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(runs as u64 * STEPS_PER_RUN);
    let template = if runs > 1 {
        format!("{{bar:40}} {{percent:>3}}% of {runs} simulations, {{elapsed}} wall, eta {{eta}}")
    } else {
        "{bar:40} {percent:>3}% of simulated time, {elapsed} wall, eta {eta}".to_owned()
    };
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    Some(ProgressFeed { bar, steps: (0..runs).map(|_| AtomicU64::new(0)).collect() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn parallel_results_keep_the_items_order() {
        let items: Vec<u64> = (0..23).collect();
        let results = in_parallel(&items, 4, |index, &item| {
            // Later items finish first.
            std::thread::sleep(std::time::Duration::from_millis(23 - item));
            Ok::<_, String>((index, item * 2))
        })
        .unwrap();
        assert_eq!(results, items.iter().map(|&i| (i as usize, i * 2)).collect::<Vec<_>>());
        assert_eq!(
            in_parallel(&[] as &[u64], 4, |_, _| Ok::<u64, ()>(1)).unwrap(),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn a_parallel_failure_names_its_item_and_stops_new_ones() {
        let started = AtomicUsize::new(0);
        let items: Vec<u32> = (0..50).collect();
        let err = in_parallel(&items, 1, |_, &item| {
            started.fetch_add(1, Ordering::Relaxed);
            if item == 3 { Err(format!("item {item} failed")) } else { Ok(item) }
        })
        .unwrap_err();
        assert_eq!(err, (3, "item 3 failed".to_owned()));
        assert_eq!(started.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn threads_are_at_least_one_and_at_most_the_runs() {
        assert_eq!(threads_for(0), 1);
        assert_eq!(threads_for(1), 1);
        assert!(threads_for(1_000) >= 1);
    }
}
