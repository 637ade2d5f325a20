#!/usr/bin/env bash
# The whole test suite: formatting, lints, static checks of the packaging, and every
# unit and integration test against real Redis, RabbitMQ and a Kafka-protocol broker.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh start
trap 'scripts/services.sh stop' EXIT
export DELAY_BRIDGE_TANSU="$(scripts/services.sh tansu-path)"

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
python3 tests/static/check_compose.py
promtool check config docker/prometheus.yml
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast "$@"
else
  cargo test --locked --no-fail-fast "$@"
fi
