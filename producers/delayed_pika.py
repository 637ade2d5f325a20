#!/usr/bin/env python3
"""Publishing a delayed message to delay-bridge's RabbitMQ ingress with pika: copy the
function, or run it as a command.

    delayed_pika.py EXCHANGE ROUTING_KEY BODY DELAY_MS [MESSAGE_ID]

EXCHANGE is a trigger's `[triggers.ingress] exchange` (the bridge declares it). The message is
due DELAY_MS milliseconds after the bridge takes it in, as with the delayed-message plugin's
`x-delay`, and is then published to the trigger's exchange with ROUTING_KEY and these
properties. With a MESSAGE_ID, `delay-bridge cancel -t TRIGGER MESSAGE_ID` cancels it, and
publishing it twice stores it once. RabbitMQ is AMQP_URL,
amqp://guest:guest@127.0.0.1:5672/%2f by default. Needs `pip install pika`.
"""

import os
import sys

import pika


def publish_delayed(channel, exchange, routing_key, body, delay_ms, message_id=None, headers=None):
    """Publishes `body` (bytes) to be delivered `delay_ms` milliseconds later. On a channel in
    confirm mode (`channel.confirm_delivery()`) it returns once the broker has the message,
    and raises if no queue is bound to the exchange (the bridge has not declared it yet)."""
    properties = pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=message_id,
        headers={**(headers or {}), "x-delay": int(delay_ms)},
    )
    channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)


def main(argv):
    if len(argv) not in (5, 6):
        sys.exit(__doc__)
    exchange, routing_key, body, delay_ms = argv[1], argv[2], argv[3].encode(), int(argv[4])
    message_id = argv[5] if len(argv) == 6 else None
    url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        publish_delayed(channel, exchange, routing_key, body, delay_ms, message_id)
    finally:
        connection.close()


if __name__ == "__main__":
    main(sys.argv)
