#!/usr/bin/env bash
# A Postgres high-availability stack from Debian's packages, for the HA test (test/ha/) and for trying a
# failover by hand: etcd (Patroni's store), two Postgres 15 instances managed by Patroni, and HAProxy
# routing to the leader by Patroni's REST health check (GET /primary answers 200 only on the leader).
# The coordinator's DATABASE_URL is HAProxy's address: the stable address that follows the leader.
#
#   scripts/ha-stack.sh up      start it (prints DATABASE_URL); `npm run ha:up`
#   scripts/ha-stack.sh down    stop everything it started and remove its directory; `npm run ha:down`
#   scripts/ha-stack.sh env     print the addresses (sourceable)
#
# Settings (environment):
#   HA_DIR          where everything lives (data, configs, logs, pids): default /tmp/quota-ha
#   HA_PORT_BASE    first of 8 consecutive ports: etcd client, etcd peer, Postgres pg1, pg2, Patroni REST
#                   pg1, pg2, HAProxy (the coordinator's), HAProxy stats: default 25400 (clear of 5432)
#   HA_SYNCHRONOUS  true (default): Patroni's synchronous_mode, a COMMIT is acknowledged only once the
#                   standby has it; false: an asynchronous standby (the last acknowledged commits can be
#                   lost when the leader is).
#
# Needs: apt-get install -y patroni etcd-server haproxy (and postgresql-15). Postgres refuses to run as
# root: run as root, Patroni runs as the `postgres` user.
set -euo pipefail

HA_DIR="${HA_DIR:-/tmp/quota-ha}"
HA_PORT_BASE="${HA_PORT_BASE:-25400}"
HA_SYNCHRONOUS="${HA_SYNCHRONOUS:-true}"
PG_BIN=/usr/lib/postgresql/15/bin

ETCD_PORT=$((HA_PORT_BASE + 0))
ETCD_PEER_PORT=$((HA_PORT_BASE + 1))
PG1_PORT=$((HA_PORT_BASE + 2))
PG2_PORT=$((HA_PORT_BASE + 3))
REST1_PORT=$((HA_PORT_BASE + 4))
REST2_PORT=$((HA_PORT_BASE + 5))
HAPROXY_PORT=$((HA_PORT_BASE + 6))
HAPROXY_STATS_PORT=$((HA_PORT_BASE + 7))
DATABASE_URL="postgres://postgres@127.0.0.1:${HAPROXY_PORT}/postgres"

# How long the stack may take to come up before `up` gives up.
UP_SECONDS_MAX=90

print_env() {
  cat <<EOF
HA_DIR=${HA_DIR}
HA_PATRONI_CONFIG=${HA_DIR}/pg1.yml
HA_ETCD_PORT=${ETCD_PORT}
HA_PG1_PORT=${PG1_PORT}
HA_PG2_PORT=${PG2_PORT}
HA_REST1_PORT=${REST1_PORT}
HA_REST2_PORT=${REST2_PORT}
HA_HAPROXY_PORT=${HAPROXY_PORT}
DATABASE_URL=${DATABASE_URL}
EOF
}

missing_binaries() {
  local missing=()
  for binary in patroni patronictl etcd haproxy "${PG_BIN}/initdb"; do
    command -v "$binary" >/dev/null 2>&1 || missing+=("$binary")
  done
  echo "${missing[*]}"
}

# The user Postgres runs as: `postgres` when root (initdb and postgres refuse root).
as_server_user=()
if [ "$(id -u)" = "0" ]; then as_server_user=(runuser -u postgres --); fi

# Starts a daemon in its own session (so that `down` can end it and its children), logging to a file.
start_daemon() {
  local name=$1
  shift
  setsid "$@" >"${HA_DIR}/log/${name}.log" 2>&1 </dev/null &
  echo $! >"${HA_DIR}/run/${name}.pid"
}

wait_for() {
  local what=$1
  shift
  local until=$((SECONDS + UP_SECONDS_MAX))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$until" ]; then
      echo "ha-stack: ${what} not within ${UP_SECONDS_MAX} s; logs in ${HA_DIR}/log" >&2
      tail -n 30 "${HA_DIR}"/log/*.log >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

patroni_config() {
  local name=$1 pg_port=$2 rest_port=$3
  cat <<EOF
scope: quota-ha
namespace: /quota-ha/
name: ${name}
restapi:
  listen: 127.0.0.1:${rest_port}
  connect_address: 127.0.0.1:${rest_port}
etcd3:
  hosts: 127.0.0.1:${ETCD_PORT}
bootstrap:
  dcs:
    # A leader whose Patroni stops answering loses the key after ttl; each node acts every loop_wait.
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    # A primary whose postmaster died is failed over at once rather than restarted in place (default
    # 300 s): the failover the test measures. With synchronous_mode only the synchronous standby may
    # be promoted, so nothing acknowledged is lost by failing over.
    primary_start_timeout: 0
    synchronous_mode: ${HA_SYNCHRONOUS}
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_log_hints: "on"
        max_connections: 200
        shared_buffers: 64MB
        wal_keep_size: 256MB
        max_wal_senders: 10
        max_replication_slots: 10
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:${pg_port}
  connect_address: 127.0.0.1:${pg_port}
  data_dir: ${HA_DIR}/${name}
  bin_dir: ${PG_BIN}
  pgpass: ${HA_DIR}/run/${name}.pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: ${HA_DIR}/run
EOF
}

haproxy_config() {
  cat <<EOF
global
  maxconn 2000
defaults
  mode tcp
  # A connection refused by a server not yet marked down is closed at once, not retried: HAProxy waits
  # up to a second before each retry, so its default 3 retries held a coordinator's connection attempt
  # for ~3 s while the leader changed (the coordinator retries by itself, a quarter of a second later).
  retries 0
  timeout connect 1s
  # A coordinator's member-lock session is idle for as long as it lives: no idle timeout on the
  # primary's sessions (HAProxy's own would end the lock and step the process down from everything).
  timeout client 0
  timeout server 0
  timeout check 1s
listen stats
  mode http
  bind 127.0.0.1:${HAPROXY_STATS_PORT}
  stats enable
  stats uri /
listen primary
  bind 127.0.0.1:${HAPROXY_PORT}
  # Patroni answers 200 on /primary only on the leader with a running, writable Postgres.
  option httpchk OPTIONS /primary
  http-check expect status 200
  # Checked every 500 ms (250 ms while changing state); down after 1 failure (Patroni's 503 on /primary
  # is decisive: the node no longer leads), up after 1 success. A server marked down has its sessions
  # closed (every coordinator session resets, as at a failover), so none lingers on a demoted one.
  default-server inter 500ms fastinter 250ms downinter 250ms fall 1 rise 1 on-marked-down shutdown-sessions
  server pg1 127.0.0.1:${PG1_PORT} maxconn 500 check port ${REST1_PORT}
  server pg2 127.0.0.1:${PG2_PORT} maxconn 500 check port ${REST2_PORT}
EOF
}

writable_through_haproxy() {
  [ "$("${PG_BIN}/psql" -Atq "${DATABASE_URL}" -c "select not pg_is_in_recovery()" 2>/dev/null)" = "t" ]
}

synchronous_standby_present() {
  [ "$("${PG_BIN}/psql" -Atq "${DATABASE_URL}" -c "select count(*) from pg_stat_replication where sync_state = 'sync'" 2>/dev/null)" = "1" ]
}

streaming_standby_present() {
  [ "$("${PG_BIN}/psql" -Atq "${DATABASE_URL}" -c "select count(*) from pg_stat_replication where state = 'streaming'" 2>/dev/null)" = "1" ]
}

rest_answers() {
  curl -fsS "http://127.0.0.1:$1/$2" >/dev/null
}

up() {
  local missing
  missing=$(missing_binaries)
  if [ -n "$missing" ]; then
    echo "ha-stack: missing ${missing}: apt-get install -y patroni etcd-server haproxy postgresql-15" >&2
    exit 1
  fi
  if [ -d "${HA_DIR}/run" ]; then
    echo "ha-stack: ${HA_DIR} is in use (scripts/ha-stack.sh down first)" >&2
    exit 1
  fi
  mkdir -p "${HA_DIR}/log" "${HA_DIR}/run" "${HA_DIR}/etcd"
  if [ "$(id -u)" = "0" ]; then chown postgres:postgres "${HA_DIR}" "${HA_DIR}/run" "${HA_DIR}/log"; fi
  chmod 700 "${HA_DIR}"

  start_daemon etcd etcd --name quota-ha --data-dir "${HA_DIR}/etcd" \
    --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster "quota-ha=http://127.0.0.1:${ETCD_PEER_PORT}" --initial-cluster-state new
  wait_for "etcd" curl -fsS "http://127.0.0.1:${ETCD_PORT}/health"

  patroni_config pg1 "${PG1_PORT}" "${REST1_PORT}" >"${HA_DIR}/pg1.yml"
  patroni_config pg2 "${PG2_PORT}" "${REST2_PORT}" >"${HA_DIR}/pg2.yml"
  haproxy_config >"${HA_DIR}/haproxy.cfg"
  if [ "$(id -u)" = "0" ]; then chown postgres:postgres "${HA_DIR}/pg1.yml" "${HA_DIR}/pg2.yml"; fi
  if ! "${as_server_user[@]}" test -r "${HA_DIR}/pg1.yml"; then
    echo "ha-stack: the postgres user cannot read ${HA_DIR}: every directory above it must let it through" >&2
    exit 1
  fi

  # pg1 first, so that it bootstraps the cluster and leads; pg2 then clones it and follows.
  start_daemon pg1 "${as_server_user[@]}" patroni "${HA_DIR}/pg1.yml"
  wait_for "pg1 leading" rest_answers "${REST1_PORT}" primary
  start_daemon pg2 "${as_server_user[@]}" patroni "${HA_DIR}/pg2.yml"
  wait_for "pg2 streaming" rest_answers "${REST2_PORT}" replica

  start_daemon haproxy haproxy -db -f "${HA_DIR}/haproxy.cfg"
  wait_for "a writable primary through HAProxy" writable_through_haproxy
  if [ "${HA_SYNCHRONOUS}" = "true" ]; then
    wait_for "pg2 synchronous" synchronous_standby_present
  else
    wait_for "pg2 streaming" streaming_standby_present
  fi
  print_env
}

# Ends the daemons named (each runs in its own session: its process group goes with it), all at once:
# SIGTERM, then SIGKILL whatever is left after 10 s.
stop_daemons() {
  local pids=()
  for name in "$@"; do
    local pid_file="${HA_DIR}/run/${name}.pid"
    [ -f "$pid_file" ] || continue
    pids+=("$(cat "$pid_file")")
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  for pid in "${pids[@]}"; do kill -TERM -- "-${pid}" 2>/dev/null || true; done
  for _ in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-${pid}" 2>/dev/null || true; done
}

down() {
  [ -d "${HA_DIR}/run" ] || return 0
  # HAProxy first (the coordinators see the address go), then both Patronis (each stops its Postgres),
  # then etcd.
  stop_daemons haproxy
  stop_daemons pg1 pg2
  stop_daemons etcd
  # A Postgres left behind by a killed Patroni (its own session is the Patroni's): by its pid file.
  for name in pg1 pg2; do
    local pid_file="${HA_DIR}/${name}/postmaster.pid"
    [ -f "$pid_file" ] && kill -KILL "$(head -n 1 "$pid_file")" 2>/dev/null || true
  done
  rm -rf "${HA_DIR}"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) print_env ;;
  *)
    echo "usage: $0 up|down|env" >&2
    exit 2
    ;;
esac
