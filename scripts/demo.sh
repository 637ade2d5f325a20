#!/usr/bin/env bash
# Quick start: runs the bridge on config/example.toml against the local Redis and
# RabbitMQ, schedules a few messages 1-5 s ahead (plus one cancelled and one
# rescheduled), and prints them as they arrive on the `orders.due` queue with
# their lateness. The example's exchange and queue are declared by the bridge.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG="${1:-config/example.toml}"
cargo build --quiet
BIN=target/debug/delay-bridge

"$BIN" check --config "$CONFIG" >/dev/null
"$BIN" run --config "$CONFIG" 2>target/demo-bridge.log &
BRIDGE=$!
trap 'kill -TERM $BRIDGE 2>/dev/null; wait $BRIDGE 2>/dev/null || true' EXIT

# Wait for the bridge's HTTP endpoint and the RabbitMQ sink to come up.
for _ in $(seq 1 100); do
  if curl -fsS http://127.0.0.1:9464/metrics 2>/dev/null | grep -q 'delay_bridge_sink_up{sink="rabbit"} 1'; then
    break
  fi
  sleep 0.1
done

echo "scheduling 5 messages due in 1..5 s, cancelling one and moving one earlier"
for i in 1 2 3 4 5; do
  "$BIN" enqueue --config "$CONFIG" --trigger orders --delay "${i}s" "{\"order\":$i}" >/dev/null
done
"$BIN" enqueue --config "$CONFIG" --trigger orders --delay 3s '{"order":"cancelled"}' >/dev/null
redis-cli ZREM 'delay:{orders}' '{"order":"cancelled"}' >/dev/null
"$BIN" enqueue --config "$CONFIG" --trigger orders --delay 500ms '{"order":5}' >/dev/null

echo "consuming orders.due (late = arrival time minus due time):"
"$BIN" consume --queue orders.due --count 5 --idle 10s
"$BIN" stats --config "$CONFIG"
