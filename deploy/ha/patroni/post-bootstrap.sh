#!/bin/sh
# Run once by Patroni on the node that bootstraps the cluster ($1: a connection string to it): the
# coordinator's role and database. pg_read_all_stats lets it read pg_stat_replication's sync_state,
# which `serve` logs and charts as quota_postgres_synchronous_standbys.
set -eu
psql "$1" -v ON_ERROR_STOP=1 \
  -v password="${QUOTA_DATABASE_PASSWORD:?set it in .env}" <<'SQL'
create role quota login password :'password';
grant pg_read_all_stats to quota;
create database quota owner quota;
SQL
