#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with a Rust toolchain: installs what is
# missing (scripts/setup.sh test: Redis, RabbitMQ, promtool, OpenSSL headers, cargo-nextest,
# PyYAML, Chromium and chromedriver for the console's test, and what the producer snippets in
# producers/ run on: Ruby with redis-rb, redis-py, node-redis, and MkDocs for the book), starts
# the services (tansu, a Kafka-protocol broker, is built into a cache once), then checks
# formatting, lints, the packaging statically, builds the book under docs/ (a broken link or
# anchor fails), runs every unit and integration test against the real services, and
# installs, runs and purges the Debian package. Extra
# arguments go to nextest.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh test

scripts/services.sh start
trap 'scripts/services.sh stop' EXIT
export DELAY_BRIDGE_TANSU="$(scripts/services.sh tansu-path)"
export DELAY_BRIDGE_VALKEY="$(scripts/services.sh valkey-path)"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
python3 tests/static/check_compose.py
python3 tests/static/check_workflows.py
promtool check config docker/prometheus.yml
python3 -m mkdocs build --strict --site-dir "${TMPDIR:-/tmp}/delay-bridge-site"
cargo nextest run --workspace --locked --no-fail-fast "$@"
# The Debian package around the binary just tested: install, a message through, purge.
packaging/deb/test.sh "${CARGO_TARGET_DIR:-target}/debug/delay-bridge"
