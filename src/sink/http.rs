//! HTTP sink: a message counts as delivered when its endpoint answers 2xx to its own method and body; an endpoint that refuses connections is the sink's failure, not the messages'.

mod client;
mod down;
mod outcome;
mod recent;
mod request;
mod signature;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus::IntCounter;
use tokio_util::sync::CancellationToken;

use super::blame::{self, Chosen};
use super::window::Window;
use super::{await_confirms, Batch, OutMessage, Outcome, PublishError};
use crate::config::{Destination, HttpRoute, HttpSinkConfig};
use crate::metrics::Metrics;
use crate::tls::Tls;
use down::Endpoints;
use recent::{Member, Recent};

/// How often an endpoint that refused connections is tried again.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// The classes requests are counted by, in the order of [`Shared::classes`].
const CLASSES: [&str; 7] = ["1xx", "2xx", "3xx", "4xx", "5xx", "timeout", "error"];

/// What the sink and its publishers share.
struct Shared {
    /// The sink's name.
    name: String,
    /// One client, its pool shared by every trigger and worker on the sink.
    client: reqwest::Client,
    /// Requests in flight on the sink (`max_concurrency`), shared by the triggers in turn.
    window: Window,
    /// The signing secret, if requests are signed.
    secret: Option<Vec<u8>>,
    /// `allow_link_local`: address literals are checked here, names by the resolver.
    allow_link_local: bool,
    /// Endpoints down or asked to wait, by URL: routes to them get no publisher until they
    /// accept connections, or the wait is over.
    down: Endpoints,
    /// The recent answers of each endpoint, by URL.
    recent: Mutex<Recent>,
    /// Requests by class, once the metrics are known.
    classes: OnceLock<Vec<IntCounter>>,
}

impl Shared {
    /// The recent answers (a poisoned lock still holds usable ones).
    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one request of `class`.
    fn count(&self, class: &str) {
        if let (Some(counters), Some(i)) =
            (self.classes.get(), CLASSES.iter().position(|c| *c == class))
        {
            counters[i].inc();
        }
    }
}

/// A configured HTTP client shared by every trigger that uses the sink.
pub struct HttpSink {
    shared: Arc<Shared>,
}

impl HttpSink {
    /// Builds the client on `tls` and reads the signing secret; nothing is connected yet.
    pub fn new(name: &str, config: &HttpSinkConfig, tls: &Tls) -> anyhow::Result<Self> {
        let secret = config
            .signing_secret_file
            .as_deref()
            .map(crate::secret::read_file)
            .transpose()?
            .map(String::into_bytes);
        let (client, tls) = client::build(config, tls)?;
        Ok(Self {
            shared: Arc::new(Shared {
                name: name.to_string(),
                client,
                window: Window::new(config.max_concurrency),
                secret,
                allow_link_local: config.allow_link_local,
                down: Endpoints::new(tls),
                recent: Mutex::default(),
                classes: OnceLock::new(),
            }),
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// False while an endpoint refuses connections.
    pub fn is_up(&self) -> bool {
        self.shared.down.none_down()
    }

    /// The endpoints down and what they answered, for `/readyz`.
    pub fn why_down(&self) -> String {
        self.shared.down.describe()
    }

    /// The routes are now `destinations` (after a reload): what the sink knew of an
    /// endpoint no route names any more is forgotten, so that a corrected URL starts fresh.
    pub fn keep_endpoints(&self, destinations: &[&Destination]) {
        let urls: BTreeSet<&str> = destinations
            .iter()
            .filter_map(|d| match d {
                Destination::Http(route) => route.fixed_url(),
                _ => None,
            })
            .collect();
        self.shared.down.retain(&urls);
        self.shared.recent().retain(|url| urls.contains(url));
    }

    /// Counts requests by class into the metrics, mirrors `sink_up`, and tries the endpoints
    /// that are down until they accept connections again.
    pub async fn supervise(&self, metrics: Metrics, cancel: CancellationToken) {
        let name = self.shared.name.as_str();
        let _ = self.shared.classes.set(
            CLASSES
                .iter()
                .map(|c| metrics.http_responses.with_label_values(&[name, c]))
                .collect(),
        );
        let gauge = metrics.sink_up.with_label_values(&[name]);
        loop {
            gauge.set(i64::from(self.is_up()));
            let up = tokio::select! {
                up = self.shared.down.probe() => up,
                _ = cancel.cancelled() => return,
            };
            for endpoint in up {
                tracing::info!(
                    sink = name,
                    endpoint,
                    "the endpoint accepts connections again"
                );
            }
            gauge.set(i64::from(self.is_up()));
            tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// A publisher for `route`; fails while the route's endpoint is down or asked the bridge
    /// to wait (`Retry-After`), so that workers do not claim.
    pub fn publisher(&self, route: &HttpRoute) -> Result<HttpPublisher, PublishError> {
        let endpoint: Option<Arc<str>> = route.fixed_url().map(Arc::from);
        if let Some(url) = &endpoint {
            if let Some(why) = self.shared.down.why(url) {
                return Err(PublishError::Connection(format!(
                    "endpoint {url} unreachable: {why}"
                )));
            }
            if let Some(left) = self.shared.down.waiting(url) {
                return Err(PublishError::Connection(format!(
                    "endpoint {url} asked to wait (Retry-After): {} s left",
                    left.as_secs_f64().ceil()
                )));
            }
        }
        Ok(HttpPublisher {
            shared: self.shared.clone(),
            route: route.clone(),
            fixed: endpoint
                .as_deref()
                .map(|url| url::Url::parse(url).map_err(|e| unparsed(url, e))),
            endpoint,
        })
    }
}

/// Why `url` is no URL, as a message's dead letter says.
fn unparsed(url: &str, e: url::ParseError) -> String {
    format!("url `{url}`: {e}")
}

/// A worker's handle: the sink's client bound to one route.
#[derive(Clone)]
pub struct HttpPublisher {
    shared: Arc<Shared>,
    route: HttpRoute,
    /// The route's own URL, if it has one.
    endpoint: Option<Arc<str>>,
    /// That URL parsed, once for every request to it (or why it does not parse).
    fixed: Option<Result<url::Url, String>>,
}

impl HttpPublisher {
    /// False while the route's endpoint is down or asked to wait: the worker asks the sink again.
    pub fn is_usable(&self) -> bool {
        self.endpoint
            .as_ref()
            .is_none_or(|e| !self.shared.down.is_down(e) && self.shared.down.waiting(e).is_none())
    }

    /// Sends every message (at most `max_concurrency` requests at once on the sink, shared by
    /// the triggers in turn) and reports each 2xx to `confirms` as it arrives. When no
    /// request of the batch got an answer and every one to the route's own URL failed to
    /// connect, the endpoint is down: those messages go back without an attempt, and the
    /// route gets no publisher until the endpoint accepts connections again. A status every
    /// recent request to its endpoint got is marked so (see [`recent`]).
    pub async fn publish_batch(&mut self, batch: Batch<'_, '_>) -> Vec<Outcome> {
        let mut results = batch.unconfirmed();
        // Per message: sent (not refused before sending), and failed to connect.
        let mut sent = vec![false; batch.messages.len()];
        let mut unreachable = vec![false; batch.messages.len()];
        // Per message sent: its endpoint's URL and the hash it is known by there.
        let mut sent_to: Vec<Option<(Arc<str>, Member)>> = vec![None; batch.messages.len()];
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // Validated with the configuration: one of POST, PUT, PATCH, DELETE.
        let method = reqwest::Method::from_bytes(self.route.method.as_bytes())
            .unwrap_or(reqwest::Method::POST);
        let turn = self.shared.window.turn(batch.trigger);
        let turn = &turn;
        let pending = FuturesUnordered::new();
        for (i, m) in batch.messages.iter().enumerate() {
            match self.request(batch.trigger, m, &method, now_ms) {
                Ok(request) => {
                    sent[i] = true;
                    let url: Arc<str> = match (m.url, &self.endpoint) {
                        (Some(own), _) => Arc::from(own),
                        (None, Some(fixed)) => fixed.clone(),
                        (None, None) => Arc::from(""),
                    };
                    let member = recent::member(m.member);
                    sent_to[i] = Some((url.clone(), member));
                    let shared = self.shared.clone();
                    pending.push(async move {
                        // One request of a trigger at a time waits for room: a herd on
                        // another trigger holds this one up by one request, not all of them.
                        let _room = shared.window.room_in(turn, 1).await;
                        let ended = match shared.client.execute(request).await {
                            Ok(response) => outcome::answered(response).await,
                            Err(e) => outcome::failed(&e),
                        };
                        shared.count(ended.class);
                        let status = match &ended.outcome {
                            Ok(_) => Some(200),
                            Err(PublishError::HttpStatus { status, .. }) => Some(*status),
                            Err(_) => None,
                        };
                        if let Some(status) = status {
                            shared.recent().answered(&url, member, status);
                        }
                        (i, ended)
                    });
                }
                Err(e) => results[i] = Err(e),
            }
        }
        let answers = pending.map(|(i, ended)| {
            unreachable[i] = ended.unreachable;
            (i, ended.outcome)
        });
        await_confirms(
            &mut results,
            answers,
            batch.timeout,
            batch.abort,
            batch.confirms,
        )
        .await;
        self.every_request(&sent_to, &mut results);
        self.retry_after(batch.messages, &results);
        self.endpoint_down(batch.messages, &mut results, &sent, &unreachable);
        results
    }

    /// Marks each status that every recent request to its endpoint got (`every_request`),
    /// unless that endpoint gave a 2xx to another message of the batch: then the messages
    /// it failed are proven at fault.
    fn every_request(&self, sent_to: &[Option<(Arc<str>, Member)>], results: &mut [Outcome]) {
        let mut recent = self.shared.recent();
        let went_through: BTreeSet<&str> = sent_to
            .iter()
            .zip(results.iter())
            .filter_map(|(to, r)| to.as_ref().filter(|_| r.is_ok()))
            .map(|(url, _)| &**url)
            .collect();
        for url in &went_through {
            let failed: Vec<Member> = sent_to
                .iter()
                .zip(results.iter())
                .filter_map(|(to, r)| to.as_ref().filter(|_| r.is_err()))
                .filter(|(u, _)| **u == **url)
                .map(|(_, m)| *m)
                .collect();
            recent.others_went_through(url, &failed);
        }
        for (to, r) in sent_to.iter().zip(results.iter_mut()) {
            let (
                Some((url, _)),
                Err(PublishError::HttpStatus {
                    status,
                    every_request,
                    ..
                }),
            ) = (to, r)
            else {
                continue;
            };
            *every_request = !went_through.contains(&**url) && recent.every_request(url, *status);
        }
    }

    /// The request of one message, or why it cannot be sent.
    fn request(
        &self,
        trigger: &str,
        m: &OutMessage<'_>,
        method: &reqwest::Method,
        now_ms: i64,
    ) -> Result<reqwest::Request, PublishError> {
        let url = match (m.url, &self.fixed) {
            (Some(own), _) => {
                url::Url::parse(own).map_err(|e| PublishError::BadPayload(unparsed(own, e)))?
            }
            (None, Some(Ok(url))) => url.clone(),
            (None, Some(Err(why))) => return Err(PublishError::BadPayload(why.clone())),
            (None, None) => return Err(PublishError::BadPayload("the message has no URL".into())),
        };
        if !self.shared.allow_link_local {
            if let Some(why) = client::literal_blocked(&url) {
                return Err(PublishError::AddressNotAllowed(why));
            }
        }
        let parts = request::parts(trigger, m, self.shared.secret.as_deref(), now_ms)?;
        let client = &self.shared.client;
        let mut request = client
            .request(method.clone(), url)
            .body(parts.body)
            .build()
            .map_err(|e| PublishError::BadPayload(e.to_string()))?;
        if request.headers().is_empty() {
            // Nothing to merge with: the message's headers are the request's as they are.
            *request.headers_mut() = parts.headers;
            return Ok(request);
        }
        // Credentials in the URL gave it an `authorization` the message's own headers replace.
        reqwest::RequestBuilder::from_parts(client.clone(), request)
            .headers(parts.headers)
            .build()
            .map_err(|e| PublishError::BadPayload(e.to_string()))
    }

    /// Honours the `Retry-After` of an answer of the route's own URL that holds the trigger:
    /// the route gets no publisher, and so claims nothing, until then. (A message's own URL
    /// asking so delays that message's retry.)
    fn retry_after(&self, messages: &[OutMessage<'_>], results: &[Outcome]) {
        let Some(endpoint) = &self.endpoint else {
            return;
        };
        let asked = messages
            .iter()
            .zip(results)
            .filter(|(m, _)| m.url.is_none())
            .filter_map(|(_, r)| r.as_ref().err())
            .filter(|e| blame::holds_own(e, Chosen::default()))
            .filter_map(PublishError::retry_after)
            .max();
        if let Some(d) = asked {
            self.shared.down.wait(endpoint, d);
        }
    }

    /// When nothing of the batch was answered and every request sent to the route's own URL
    /// failed to connect, marks the endpoint down and puts those messages back (those
    /// refused before sending keep their own error).
    fn endpoint_down(
        &self,
        messages: &[OutMessage<'_>],
        results: &mut [Outcome],
        sent: &[bool],
        unreachable: &[bool],
    ) {
        let Some(endpoint) = &self.endpoint else {
            return;
        };
        let answered = results
            .iter()
            .any(|r| matches!(r, Ok(_) | Err(PublishError::HttpStatus { .. })));
        let own: Vec<usize> = (0..messages.len())
            .filter(|&i| messages[i].url.is_none() && sent[i])
            .collect();
        if answered || own.is_empty() || !own.iter().all(|&i| unreachable[i]) {
            return;
        }
        let why = match &results[own[0]] {
            Err(e) => e.to_string(),
            Ok(_) => return,
        };
        for &i in &own {
            results[i] = Err(PublishError::Connection(why.clone()));
        }
        if self.shared.down.mark(endpoint, why.clone()) {
            tracing::warn!(sink = %self.shared.name, endpoint = %endpoint, error = %why,
                "the endpoint refuses connections: its messages stay in Redis, no attempt counted, until it accepts again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HttpTarget;
    use crate::envelope::{HeaderValue, Properties};
    use crate::sink::blame::{judge, Chosen, Verdict};

    /// A loopback port nothing listens on: connections to it are refused.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn a_refused_endpoint_puts_its_messages_back_and_is_down_until_it_listens() {
        let port = closed_port();
        let config: HttpSinkConfig = serde_json::from_value(serde_json::json!({})).unwrap();
        let sink = HttpSink::new("hooks", &config, &Tls::system()).unwrap();
        let route = HttpRoute {
            url: HttpTarget::Url(format!("http://127.0.0.1:{port}/")),
            method: "POST".into(),
            allowed_urls: None,
        };
        let mut publisher = sink.publisher(&route).unwrap();
        let bad = Properties {
            headers: vec![("bad name".into(), HeaderValue::Text("x".into()))],
            ..Properties::default()
        };
        let message = |properties| OutMessage {
            payload: b"body",
            member: b"m",
            due_ms: 1,
            attempt: 1,
            id: "0123456789abcdef",
            routing_key: None,
            properties,
            url: None,
            topic: None,
        };
        let batch = [message(None), message(Some(&bad)), message(None)];
        let abort = CancellationToken::new();
        let outcomes = publisher
            .publish_batch(Batch {
                trigger: "t",
                messages: &batch,
                timeout: Duration::from_secs(5),
                abort: &abort,
                confirms: None,
            })
            .await;
        let verdicts: Vec<Verdict> = outcomes
            .iter()
            .map(|o| judge(o.as_ref().unwrap_err(), Chosen::default(), false))
            .collect();
        let held = Verdict::PutBack { hold: true };
        assert_eq!(verdicts[0], held, "{outcomes:?}");
        assert!(
            matches!(verdicts[1], Verdict::DeadLetter { .. }),
            "{outcomes:?}"
        );
        assert_eq!(verdicts[2], held, "{outcomes:?}");
        assert!(!sink.is_up());
        assert!(sink.why_down().contains(&format!("127.0.0.1:{port}")));
        assert!(!publisher.is_usable());
        assert!(sink.publisher(&route).is_err(), "no publisher while down");

        // It listens again: the supervisor finds it and the route gets a publisher.
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let cancel = CancellationToken::new();
        let supervise = sink.supervise(Metrics::new(), cancel.clone());
        let up = async {
            while !sink.is_up() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            _ = supervise => panic!("supervision ended"),
            r = tokio::time::timeout(Duration::from_secs(5), up) => r.unwrap(),
        }
        cancel.cancel();
        assert!(sink.publisher(&route).is_ok());
        drop(listener);
    }
}
