#!/usr/bin/env bash
# A local Redis Cluster for trying cluster mode and for `bench --redis-cluster`: three masters
# with a replica each on 127.0.0.1:7000-7005 (bus ports 17000-17005), nothing kept on disk.
# Usage: scripts/redis-cluster.sh start|stop   (BASE=7000 and DIR=/tmp/delay-bridge-cluster)
set -euo pipefail

BASE="${BASE:-7000}"
DIR="${DIR:-/tmp/delay-bridge-cluster}"
PORTS=()
for i in 0 1 2 3 4 5; do PORTS+=($((BASE + i))); done

start() {
  mkdir -p "$DIR"
  for port in "${PORTS[@]}"; do
    rm -rf "${DIR:?}/$port"
    mkdir -p "$DIR/$port"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
      --cluster-enabled yes --cluster-config-file "$DIR/$port/nodes.conf" \
      --cluster-node-timeout 2000 --save "" --appendonly no \
      --dir "$DIR/$port" --logfile "$DIR/$port/redis.log" --pidfile "$DIR/$port/redis.pid" \
      </dev/null >/dev/null 2>&1
  done
  for port in "${PORTS[@]}"; do
    for _ in $(seq 1 100); do
      redis-cli -p "$port" PING >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
  local nodes=()
  for port in "${PORTS[@]}"; do nodes+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  for _ in $(seq 1 150); do
    local ok=0
    for port in "${PORTS[@]}"; do
      redis-cli -p "$port" CLUSTER INFO | grep -q 'cluster_state:ok' && ok=$((ok + 1))
    done
    if [ "$ok" -eq "${#PORTS[@]}" ]; then
      echo "redis cluster up: redis://127.0.0.1:$BASE .. redis://127.0.0.1:$((BASE + 5))"
      return 0
    fi
    sleep 0.2
  done
  echo "the cluster did not form" >&2
  return 1
}

stop() {
  for port in "${PORTS[@]}"; do
    # Read the pid before signalling: Redis deletes its pidfile on the way out.
    if [ -f "$DIR/$port/redis.pid" ]; then
      kill "$(cat "$DIR/$port/redis.pid")" 2>/dev/null || true
    fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
