#!/usr/bin/env bash
# End-to-end test of the Debian package, on a machine with Redis and RabbitMQ on localhost
# (scripts/test.sh runs it after the test suite):
#
#   packaging/deb/test.sh [BINARY]      (default: target/debug/delay-bridge)
#
# builds the .deb around BINARY, installs it with dpkg, checks the packaged config, runs the
# packaged binary as the package's user on a copy of that config with a private trigger
# key, exchange and queue, schedules a due message with redis-cli and waits for it in
# RabbitMQ (read with the binary's own `consume`), stops the bridge, then purges the package
# and checks it left nothing behind. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/../.."

binary="${1:-${CARGO_TARGET_DIR:-target}/debug/delay-bridge}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
step() { echo "deb: $*"; }
fail() { echo "deb: FAIL: $*" >&2; exit 1; }

work="$(mktemp -d)"
chmod 0755 "$work"
run_id="pkgtest-$$"
key="delay:{$run_id}"
queue="delay-bridge.$run_id"
exchange="delay-bridge.packaging"
bridge_pid=""
cleanup() {
  if [ -n "$bridge_pid" ]; then
    $sudo kill -TERM "$bridge_pid" 2>/dev/null || true
  fi
  redis-cli --scan --pattern "delay:{$run_id}*" | xargs -r redis-cli DEL >/dev/null 2>&1 || true
  if command -v rabbitmqctl >/dev/null; then
    $sudo rabbitmqctl -q delete_queue "$queue" >/dev/null 2>&1 || true
  fi
  if dpkg-query -W -f='${Status}' delay-bridge 2>/dev/null | grep -q installed; then
    $sudo dpkg --purge delay-bridge >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step "building the package around $binary"
deb="$(DPKG_DEB_COMPRESSOR_TYPE=gzip packaging/deb/build.sh "$binary" "$work/out")"
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Architecture\|Depends\):/  \1:/p'

if dpkg-query -W -f='${Status}' delay-bridge 2>/dev/null | grep -q installed; then
  step "purging a delay-bridge left installed"
  $sudo dpkg --purge delay-bridge >/dev/null
fi
step "dpkg -i"
$sudo dpkg -i "$deb"
dpkg-query -W -f='${Status}\n' delay-bridge | grep -qx 'install ok installed' || fail "not installed"
/usr/bin/delay-bridge --version
getent passwd delay-bridge >/dev/null || fail "no delay-bridge user"
[ "$(stat -c '%a %U %G' /etc/delay-bridge/config.toml)" = "640 root delay-bridge" ] \
  || fail "/etc/delay-bridge/config.toml: $(stat -c '%a %U %G' /etc/delay-bridge/config.toml)"
[ "$(stat -c %a /etc/default/delay-bridge)" = 600 ] || fail "/etc/default/delay-bridge is not 0600"
grep -qx /etc/delay-bridge/config.toml /var/lib/dpkg/info/delay-bridge.conffiles \
  || fail "the config is not a conffile"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify /lib/systemd/system/delay-bridge.service
fi

step "check --config /etc/delay-bridge/config.toml, as root and as the service's user"
/usr/bin/delay-bridge check --config /etc/delay-bridge/config.toml
$sudo runuser -u delay-bridge -- /usr/bin/delay-bridge check --config /etc/delay-bridge/config.toml >/dev/null

step "running the packaged binary on a copy of the packaged config (key $key, queue $queue)"
config="$work/config.toml"
$sudo cat /etc/delay-bridge/config.toml \
  | sed -e "s/delay:{orders}/$key/" \
        -e "s/\"orders.due\"/\"$queue\"/g" \
        -e "s/^exchange = \"orders\"/exchange = \"$exchange\"/" > "$config"
grep -q "$key" "$config" && grep -q "queue = \"$queue\"" "$config" \
  && grep -q "exchange = \"$exchange\"" "$config" || fail "the packaged config changed: adapt this test"
$sudo chgrp delay-bridge "$config"
chmod 0640 "$config"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# setpriv execs (runuser would stay the parent and turn SIGTERM into its own exit 143).
$sudo setpriv --reuid=delay-bridge --regid=delay-bridge --init-groups \
  env DELAY_BRIDGE_METRICS__LISTEN="127.0.0.1:$port" \
  /usr/bin/delay-bridge run --config "$config" 2>"$work/bridge.log" &
bridge_pid=$!

ready=""
for _ in $(seq 1 150); do
  if /usr/bin/delay-bridge health --url "http://127.0.0.1:$port/readyz" >/dev/null; then
    ready=yes
    break
  fi
  kill -0 "$bridge_pid" 2>/dev/null || break
  sleep 0.2
done
[ -n "$ready" ] || { cat "$work/bridge.log" >&2; fail "the bridge did not become ready"; }
/usr/bin/delay-bridge health --url "http://127.0.0.1:$port/healthz" || fail "health"

payload="{\"package-test\":\"$run_id\"}"
step "ZADD a due message and wait for it in $queue"
redis-cli ZADD "$key" "$(date +%s%3N)" "$payload" >/dev/null
received="$(/usr/bin/delay-bridge consume --queue "$queue" --count 1 --idle 30s)"
echo "  $received"
grep -qF "$payload" <<<"$received" || { cat "$work/bridge.log" >&2; fail "the message did not arrive"; }
[ "$(redis-cli ZCARD "$key")" = 0 ] || fail "the message is still scheduled"

step "stopping the bridge (SIGTERM drains)"
$sudo kill -TERM "$bridge_pid"
status=0
wait "$bridge_pid" || status=$?
bridge_pid=""
[ "$status" -eq 0 ] || { cat "$work/bridge.log" >&2; fail "the bridge exited $status"; }

step "dpkg --purge"
$sudo dpkg --purge delay-bridge
for left in /usr/bin/delay-bridge /etc/delay-bridge /etc/default/delay-bridge \
  /lib/systemd/system/delay-bridge.service /usr/share/doc/delay-bridge; do
  [ ! -e "$left" ] || fail "$left is left after the purge"
done
step "ok"
