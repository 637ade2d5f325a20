#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with a Rust toolchain: installs what is
# missing (Redis, RabbitMQ, promtool, OpenSSL headers, cargo-nextest, PyYAML, Chromium and
# chromedriver for the console's test, and what the producer snippets in producers/ run on:
# Ruby with redis-rb, redis-py, node-redis, and MkDocs for the documentation book), starts
# the services (tansu, a Kafka-protocol broker, is built into a cache once), then checks
# formatting, lints, the packaging statically, builds the book under docs/ (a broken link or
# anchor fails), runs every unit and integration test against the real services, and
# installs, runs and purges the Debian package. Extra
# arguments go to nextest.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v rabbitmq-server >/dev/null || need_apt+=(rabbitmq-server)
command -v promtool >/dev/null || need_apt+=(prometheus)
# rdkafka's `ssl` feature links the system OpenSSL.
dpkg -s libssl-dev >/dev/null 2>&1 || need_apt+=(libssl-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# The producer snippets (tests/it/producers.rs): Ruby with Debian's redis-rb, Node with npm, pip.
command -v ruby >/dev/null || need_apt+=(ruby)
ruby -e 'require "redis"' 2>/dev/null || need_apt+=(ruby-redis)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
# The console's test drives a headless Chromium through chromedriver.
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
pip_install() {
  # Debian's own python3 refuses pip installs (PEP 668: EXTERNALLY-MANAGED) unless told to.
  if python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    set -- --break-system-packages "$@"
  fi
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check "$@"
}
python3 -c 'import yaml' 2>/dev/null || pip_install pyyaml
python3 -c 'import redis' 2>/dev/null || pip_install redis
# The ingress's Python snippet (producers/delayed_pika.py, tests/it/ingress_producers.rs).
python3 -c 'import pika' 2>/dev/null || pip_install pika
# The documentation book (mkdocs.yml): strict, so broken links and anchors fail the build.
python3 -c 'import mkdocs' 2>/dev/null || pip_install mkdocs==1.6.1
# node-redis, amqplib and KafkaJS as pinned in producers/package-lock.json (offline and instant once installed).
npm install --prefix producers --no-audit --no-fund --silent
command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked --quiet

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
