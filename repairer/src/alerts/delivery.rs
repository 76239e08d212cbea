//! The delivery loops: one per sink, reading the event log after its cursor and sending each
//! event it wants until the sink takes it, with capped exponential backoff and jitter.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleetmend_proto::backoff::Backoff;
use tokio::task::JoinSet;

use super::{Alerts, Delivery, Sink, outbox, sign};
use crate::model::Event;

/// What one delivery attempt came to.
enum Attempt {
    Delivered,
    /// Worth trying again: the sink is down, slow, overloaded or refusing for now.
    Failed(String),
    /// The sink says this request can never succeed (400, 413, 422): retrying the same bytes
    /// forever would block every later alert behind it.
    Rejected(String),
}

impl Alerts {
    /// Runs one delivery loop per sink until this future is dropped (dropping it stops them all).
    pub async fn run(self: Arc<Self>) {
        if self.sinks.is_empty() {
            return std::future::pending().await;
        }
        let mut loops = JoinSet::new();
        for sink in &self.sinks {
            let alerts = Arc::clone(&self);
            let sink = Arc::clone(sink);
            loops.spawn(async move { alerts.deliver_forever(&sink).await });
        }
        while let Some(result) = loops.join_next().await {
            if let Err(err) = result
                && err.is_panic()
            {
                tracing::error!(error = %err, "an alert delivery loop panicked; its sink gets no more alerts");
            }
        }
    }

    async fn deliver_forever(&self, sink: &Sink) {
        loop {
            let cursor = sink.cursor.load(Ordering::Relaxed);
            let events = match outbox::next_events(&self.store, cursor, self.batch) {
                Ok(events) => events,
                Err(err) => {
                    tracing::warn!(sink = %sink.name, error = %err, "reading the event log for alerts");
                    self.clock.sleep(self.poll_interval).await;
                    continue;
                }
            };
            if events.is_empty() {
                // `notify_one` keeps a permit, so a wake that came while reading is not lost.
                tokio::select! {
                    () = sink.wake.notified() => {}
                    () = self.clock.sleep(self.poll_interval) => {}
                }
                continue;
            }
            let mut skipped = false;
            for event in &events {
                if sink.wants(event) {
                    if skipped {
                        self.save_cursor(sink);
                        skipped = false;
                    }
                    self.deliver(sink, event).await;
                    sink.cursor.store(event.id, Ordering::Relaxed);
                    self.save_cursor(sink);
                } else {
                    sink.cursor.store(event.id, Ordering::Relaxed);
                    skipped = true;
                }
            }
            if skipped {
                self.save_cursor(sink);
            }
        }
    }

    fn save_cursor(&self, sink: &Sink) {
        let cursor = sink.cursor.load(Ordering::Relaxed);
        if let Err(err) = outbox::advance(&self.store, &sink.name, cursor) {
            // The loop goes on from its cursor in memory; a restart before the next successful
            // save re-sends from the saved one, and the receiver drops the duplicates by key.
            tracing::warn!(sink = %sink.name, cursor, error = %err, "saving the alert cursor");
        }
    }

    /// Sends `event` until the sink takes it (or rejects it for good).
    async fn deliver(&self, sink: &Sink, event: &Event) {
        let delivery = match sink.format.render(&sink.name, event) {
            Ok(Some(delivery)) => delivery,
            Ok(None) => return,
            Err(err) => {
                sink.sent_error.fetch_add(1, Ordering::Relaxed);
                tracing::error!(sink = %sink.name, event = event.id, error = %err, "rendering an alert; skipped");
                return;
            }
        };
        let key = sign::idempotency_key(&sink.name, event.id);
        let signature =
            sink.secret.as_ref().map(|secret| sign::signature(secret.0.as_bytes(), &delivery.body));
        let mut failures = 0u32;
        loop {
            match attempt(sink, &delivery, &key, signature.as_deref()).await {
                Attempt::Delivered => {
                    sink.sent_ok.fetch_add(1, Ordering::Relaxed);
                    if failures > 0 {
                        tracing::info!(sink = %sink.name, event = event.id, failures, "alert delivered after retries");
                    }
                    return;
                }
                Attempt::Rejected(why) => {
                    sink.sent_error.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(sink = %sink.name, event = event.id, why, "alert rejected by the sink; skipped");
                    return;
                }
                Attempt::Failed(why) => {
                    sink.sent_error.fetch_add(1, Ordering::Relaxed);
                    let wait = backoff(sink.retry_initial, sink.retry_max, failures);
                    failures = failures.saturating_add(1);
                    tracing::warn!(
                        sink = %sink.name, event = event.id, failures, why,
                        retry_in = %humantime::format_duration(Duration::from_millis(wait.as_millis() as u64)),
                        "alert delivery failed; will retry"
                    );
                    self.clock.sleep(wait).await;
                }
            }
        }
    }
}

async fn attempt(sink: &Sink, delivery: &Delivery, key: &str, signature: Option<&str>) -> Attempt {
    let mut request = sink
        .client
        .post(&delivery.url)
        .header(reqwest::header::CONTENT_TYPE, delivery.content_type)
        .header(sign::IDEMPOTENCY_HEADER, key);
    if let Some(signature) = signature {
        request = request.header(sign::SIGNATURE_HEADER, signature);
    }
    for (name, value) in &delivery.headers {
        request = request.header(*name, value);
    }
    let response = match request.body(delivery.body.clone()).send().await {
        Ok(response) => response,
        Err(err) => return Attempt::Failed(error_chain(&err)),
    };
    let status = response.status();
    if status.is_success() {
        return Attempt::Delivered;
    }
    // The body says why; bounded so a chatty receiver cannot flood the log.
    let body = response.text().await.unwrap_or_default();
    let why = format!("HTTP {status}: {}", body.chars().take(200).collect::<String>().trim());
    match status.as_u16() {
        400 | 413 | 422 => Attempt::Rejected(why),
        _ => Attempt::Failed(why),
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The wait before retry number `failures + 1`: `initial * 2^failures` capped at `max`, with
/// jitter ([`Backoff::delay`]) so sinks that failed together do not retry in step.
pub fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    Backoff::new(initial, max).delay(failures.saturating_add(1), fastrand::f64())
}
