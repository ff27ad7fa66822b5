#!/usr/bin/env bash
# The database roles of docker compose, created once, at the first start of
# an empty postgres-data volume (the postgres image runs the scripts of
# /docker-entrypoint-initdb.d as POSTGRES_USER, then never again):
#
#   orders_migrate   owns the orders database and its schema; only the
#                    migrate service connects as it
#   orders_api       order-api
#   orders_relay     outbox-relay
#   orders_consumer  order-consumer
#   orders_operator  orderctl and the walkthrough
#   orders_relay_wal the log-tailing relay's replication connection, made
#                    only when ORDERS_RELAY_MODE=wal (REPLICATION reads
#                    every table: docs/security.md#replication)
#
# each with the password in the file of its ORDERS_DB_*_PASSWORD_FILE
# variable: the stack's secrets volume, where the secrets service put it
# (generated at the first start, or from .env: cmd/compose-secrets). The
# process roles get their privileges from the migration
# migrations/00008_roles.sql, which the migrate service applies as
# orders_migrate: it finds the roles here, so it needs no CREATEROLE.
# docs/security.md says how to change a password later.
set -euo pipefail

for v in ORDERS_DB_MIGRATE_PASSWORD_FILE ORDERS_DB_API_PASSWORD_FILE ORDERS_DB_RELAY_PASSWORD_FILE ORDERS_DB_RELAY_WAL_PASSWORD_FILE ORDERS_DB_CONSUMER_PASSWORD_FILE ORDERS_DB_OPERATOR_PASSWORD_FILE; do
	if [[ ! -s ${!v:-/nonexistent} ]]; then
		echo "10-roles.sh: $v names no file with a password (${!v:-unset}): every role needs one" >&2
		exit 1
	fi
done

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
	-v db="$POSTGRES_DB" \
	-v migrate="$(<"$ORDERS_DB_MIGRATE_PASSWORD_FILE")" \
	-v api="$(<"$ORDERS_DB_API_PASSWORD_FILE")" \
	-v relay="$(<"$ORDERS_DB_RELAY_PASSWORD_FILE")" \
	-v consumer="$(<"$ORDERS_DB_CONSUMER_PASSWORD_FILE")" \
	-v operator="$(<"$ORDERS_DB_OPERATOR_PASSWORD_FILE")" <<'SQL'
CREATE ROLE orders_migrate LOGIN PASSWORD :'migrate';
CREATE ROLE orders_api LOGIN PASSWORD :'api';
CREATE ROLE orders_relay LOGIN PASSWORD :'relay';
CREATE ROLE orders_consumer LOGIN PASSWORD :'consumer';
CREATE ROLE orders_operator LOGIN PASSWORD :'operator';
-- Their processes report what holds the transaction horizon, most often
-- another role's session (migrations/00022_read_all_stats.sql).
GRANT pg_read_all_stats TO orders_relay, orders_consumer, orders_operator;
-- The owner of the database owns its public schema (pg_database_owner), so
-- orders_migrate creates the tables, and grants on them.
ALTER DATABASE :"db" OWNER TO orders_migrate;
SQL
echo "10-roles.sh: roles orders_migrate, orders_api, orders_relay, orders_consumer, orders_operator; $POSTGRES_DB owned by orders_migrate"

if [[ ${ORDERS_RELAY_MODE:-poll} == wal ]]; then
	psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
		-v relay_wal="$(<"$ORDERS_DB_RELAY_WAL_PASSWORD_FILE")" <<'SQL'
CREATE ROLE orders_relay_wal LOGIN REPLICATION PASSWORD :'relay_wal';
SQL
	echo "10-roles.sh: ORDERS_RELAY_MODE=wal: role orders_relay_wal, with REPLICATION"
fi
