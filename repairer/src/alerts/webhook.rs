//! The `webhook` sink: the audit event itself ([`crate::model::Event`]) as JSON, POSTed to a URL
//! with the signature and idempotency headers.

use crate::alerts::Delivery;
use crate::model::Event;

/// Renders events for one webhook sink.
#[derive(Debug)]
pub(crate) struct WebhookFormat {
    url: String,
}

impl WebhookFormat {
    pub(crate) fn new(url: &str) -> WebhookFormat {
        WebhookFormat { url: url.to_owned() }
    }

    pub(crate) fn render(&self, event: &Event) -> Result<Delivery, serde_json::Error> {
        Ok(Delivery {
            url: self.url.clone(),
            content_type: "application/json",
            headers: Vec::new(),
            body: serde_json::to_vec(event)?,
        })
    }
}
