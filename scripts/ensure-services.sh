#!/usr/bin/env bash
# Makes sure the services the tests talk to are up on this machine: PostgreSQL (127.0.0.1:5432, trust
# auth, a database `test`), NATS with JetStream (127.0.0.1:4222) and Redis (127.0.0.1:6379, for the
# benchmarks' seed 003), and that the nats-server binary the security tests start is installed.
# Starts what is down with the machine's own commands; quiet when everything is up. `npm test` runs it
# first (pretest), and so does .ci/run.
set -euo pipefail

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
nats_up() { (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; }
say() { echo "ensure-services: $*" >&2; }

if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  say "installing nats-server (Debian package)"
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -q nats-server >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q nats-server >/dev/null 2>&1; }) \
      || say "could not install nats-server; the tests that start their own NATS server will fail"
  else
    say "no apt-get here; install nats-server 2.9 or later for the tests that start their own NATS server"
  fi
fi

# libfaketime: the nemesis (test/nemesis, test/cluster/nemesis.test.ts) shifts each process's wall clock with it.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing faketime (Debian package)"
  (apt-get install -y -q faketime >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q faketime >/dev/null 2>&1; }) \
    || say "could not install faketime; the nemesis runs without clock offsets"
fi

if ! pg_up; then
  say "starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
  fi
fi
if ! nats_up; then
  say "starting NATS with JetStream"
  nats_server=$(command -v nats-server || echo /usr/sbin/nats-server)
  mkdir -p /var/lib/nats-server 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --exec "$nats_server" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
fi
if ! redis_up && command -v redis-server >/dev/null 2>&1; then
  say "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log >/dev/null || true
fi

for _ in $(seq 1 30); do pg_up && nats_up && break; sleep 1; done
pg_up || { say "PostgreSQL is not answering on 127.0.0.1:5432 (start it, or set DATABASE_URL)"; exit 1; }
nats_up || { say "NATS is not answering on 127.0.0.1:4222 (start nats-server -js)"; exit 1; }

if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_database where datname = 'test'" 2>/dev/null | grep -q 1; then
  say "creating database test"
  psql -h 127.0.0.1 -U postgres -d postgres -qc "create database test" >/dev/null
fi
