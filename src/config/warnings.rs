//! What an operator should hear before the configuration is used, though nothing is wrong.

use super::route::Destination;
use super::{AmqpRouting, Config, ExchangeType, MessageFormat, Sink, SinkConfig};

impl Config {
    /// Everything an operator should hear before the configuration is used: the TLS
    /// warnings, and envelope routing that reaches further than the operator may think.
    /// Logged at start and printed by `check`.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.tls_warnings();
        if let Some(listen) = self.admin.listen.filter(|l| !l.ip().is_loopback()) {
            out.push(format!(
                "admin.listen {listen} is not loopback: the admin API's token and messages travel in clear"
            ));
        }
        for (i, t) in self.triggers.iter().enumerate() {
            let sink = self.sinks.get(t.sink()).map(Sink::settings);
            if let Some(SinkConfig::Http(http)) = sink {
                if http.timeout >= t.publish_timeout() {
                    out.push(format!(
                        "triggers[{i}]: sink {}'s timeout ({}) is not below publish_timeout ({}): \
                         a batch gives up on requests before they time out themselves",
                        t.sink(),
                        humantime::format_duration(http.timeout),
                        humantime::format_duration(t.publish_timeout())
                    ));
                }
            }
            let Destination::Amqp(route) = t.destination() else {
                continue;
            };
            let own_keys = t.format() == MessageFormat::Envelope
                || matches!(route.routing, AmqpRouting::Pointer(_));
            if own_keys && route.exchange.is_empty() && route.allowed_routing_keys.is_none() {
                out.push(format!(
                    "triggers[{i}]: messages choose their own routing key on the default exchange, \
                     which reaches every queue of the vhost: set allowed_routing_keys"
                ));
            }
            let headers_exchange = sink.is_some_and(|s| match s {
                SinkConfig::Amqp(a) => a
                    .declare
                    .iter()
                    .any(|d| d.exchange == route.exchange && d.kind == ExchangeType::Headers),
                SinkConfig::Kafka(_) | SinkConfig::Http(_) => false,
            });
            if t.format() == MessageFormat::Envelope && headers_exchange {
                out.push(format!(
                    "triggers[{i}]: `{}` is a headers exchange and envelopes set headers: \
                     messages choose their own queues, allowed_routing_keys does not apply",
                    route.exchange
                ));
            }
        }
        out
    }
}
