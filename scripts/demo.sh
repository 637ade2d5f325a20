#!/usr/bin/env bash
# Quick start: installs and starts what is missing (scripts/setup.sh demo and
# scripts/services.sh, as the test suite does: Redis and RabbitMQ on loopback), runs the
# bridge on config/example.toml, schedules a few messages 1-5 s ahead (plus one cancelled
# and one rescheduled), and prints them as they arrive on the `orders.due` queue with
# their lateness. The example's exchange and queue are declared by the bridge.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG="${1:-config/example.toml}"
scripts/setup.sh demo
scripts/services.sh start redis rabbitmq
cargo build --quiet
BIN=target/debug/delay-bridge

"$BIN" check --config "$CONFIG" >/dev/null
"$BIN" run --config "$CONFIG" 2>target/demo-bridge.log &
BRIDGE=$!
trap 'kill -TERM $BRIDGE 2>/dev/null; wait $BRIDGE 2>/dev/null || true' EXIT

# Wait until the bridge is ready: Redis and the RabbitMQ sink connected.
for _ in $(seq 1 100); do
  if "$BIN" health --config "$CONFIG" --ready --timeout 1s >/dev/null 2>&1; then
    break
  fi
  sleep 0.1
done

echo "scheduling 5 messages due in 1..5 s, cancelling one and moving one earlier"
for i in 1 2 3 4 5; do
  "$BIN" enqueue --config "$CONFIG" --trigger orders --delay "${i}s" "{\"order\":$i}" >/dev/null
done
"$BIN" enqueue --config "$CONFIG" --trigger orders --delay 3s '{"order":"cancelled"}' >/dev/null
"$BIN" cancel --config "$CONFIG" --trigger orders '{"order":"cancelled"}' >/dev/null
"$BIN" enqueue --config "$CONFIG" --trigger orders --delay 500ms '{"order":5}' >/dev/null

echo "consuming orders.due (late = arrival time minus due time):"
"$BIN" consume --queue orders.due --count 5 --idle 10s
"$BIN" stats --config "$CONFIG"
