#!/usr/bin/env bash
# Installs what is missing on a Debian machine that has a Rust toolchain, for one purpose:
#   scripts/setup.sh demo   the quick start (scripts/demo.sh): what building the bridge
#                           needs (OpenSSL headers, pkg-config), Redis and RabbitMQ;
#   scripts/setup.sh test   the whole test suite (scripts/test.sh): the above, plus promtool,
#                           Chromium and chromedriver for the console's test, what the
#                           producer snippets in producers/ run on (Ruby with redis-rb,
#                           redis-py, pika, node-redis), PyYAML, MkDocs and cargo-nextest.
# Debian packages come from apt (through sudo when not root), Python ones from PyPI, Node
# ones from npm as pinned in producers/package-lock.json. Installs nothing already there.
set -euo pipefail
cd "$(dirname "$0")/.."

purpose="${1:-demo}"
case "$purpose" in
  demo | test) ;;
  *)
    echo "usage: $0 demo|test" >&2
    exit 2
    ;;
esac

need_apt=()
# rdkafka's `ssl` feature links the system OpenSSL.
dpkg -s libssl-dev >/dev/null 2>&1 || need_apt+=(libssl-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v make >/dev/null || need_apt+=(make)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v rabbitmq-server >/dev/null || need_apt+=(rabbitmq-server)
if [ "$purpose" = test ]; then
  command -v promtool >/dev/null || need_apt+=(prometheus)
  # The producer snippets (tests/it/producers.rs): Ruby with Debian's redis-rb, Node with npm, pip.
  command -v ruby >/dev/null || need_apt+=(ruby)
  ruby -e 'require "redis"' 2>/dev/null || need_apt+=(ruby-redis)
  command -v node >/dev/null || need_apt+=(nodejs)
  command -v npm >/dev/null || need_apt+=(npm)
  python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
  # The console's test drives a headless Chromium through chromedriver.
  command -v chromium >/dev/null || need_apt+=(chromium)
  command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
[ "$purpose" = test ] || exit 0

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
