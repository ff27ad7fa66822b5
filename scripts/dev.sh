#!/usr/bin/env bash
# make dev: the whole order service on this machine, without Docker, against
# the PostgreSQL and RabbitMQ of DATABASE_URL and AMQP_URL (default: the
# local ones). It builds the binaries, applies the migrations, and runs
#
#   order-api          http://127.0.0.1:8080 (a token: make token ARGS=-operator)
#   outbox-relay x 2   admin http://127.0.0.1:9101 and :9103
#   order-consumer     admin http://127.0.0.1:9102 (fault endpoint on, for the walkthrough)
#   webhook-receiver   http://127.0.0.1:8090/notifications
#
# with their logs interleaved, each line prefixed with its process. A process
# that dies (a non-zero exit) is started again after a second, as docker
# compose's restart policy would (the walkthrough crashes the consumer on
# purpose).
# Ctrl-C stops them all: each gets SIGTERM and shuts down gracefully.
#
# The addresses above can be moved (the end-to-end test of the walkthrough
# does, to run beside other tests): DEV_API_ADDR, DEV_RELAY1_ADDR,
# DEV_RELAY2_ADDR, DEV_CONSUMER_ADDR, DEV_WEBHOOK_ADDR; DEV_BIN is where the
# binaries are built (bin/).
#
# RELAY_MODE=wal make dev runs the relays in log-tailing mode (one streams,
# the other stands by): the server must run wal_level=logical (in
# postgresql.conf, then restart it); migrate, as a superuser, then makes
# orders_relay_wal, the role with REPLICATION that the relays' replication
# connections use (MIGRATE_RELAY_WAL_ROLE). A server that cannot stream
# stops the relays at once, saying which setting is missing.
#
# DATABASE_URL's user (postgres, by default) applies the migrations: it owns
# the schema. Every process then connects as its own role, the URL's user
# replaced (scripts/db-role.sh): order-api as orders_api, the relays as
# orders_relay, the consumer as orders_consumer (docs/security.md). The roles
# have no password and log in where pg_hba.conf trusts them, as on a local
# development server; DEV_DB_ROLES=off runs every process as DATABASE_URL's
# user instead.
#
# Each relay and the consumer log in to RabbitMQ as their own user
# (orders-relay, orders-consumer), with the permissions of
# deploy/rabbitmq/definitions.json: lab/rabbitmq-users creates them, and
# orders-operator and orders-walkthrough, in AMQP_URL's vhost, logged in as
# AMQP_URL's user (an administrator: guest on a local broker), through the
# management API if the broker has one, else rabbitmqctl. Their passwords:
# RABBITMQ_PASSWORD_ORDERS_RELAY and the like, else the user's name.
# DEV_AMQP_USER_PREFIX goes before every user name (the end-to-end test's).
#
# The settings of .env, when it exists, apply (scripts/env.sh), under those
# already in the environment. `scripts/dev.sh stop` (make stop) stops a
# running make dev from another terminal, as Ctrl-C does.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
# shellcheck source=scripts/db-role.sh
source scripts/db-role.sh

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/orders?sslmode=disable}"
export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
export LOG_FORMAT="${LOG_FORMAT:-text}"

api_addr="${DEV_API_ADDR:-127.0.0.1:8080}"
relay1_addr="${DEV_RELAY1_ADDR:-127.0.0.1:9101}"
relay2_addr="${DEV_RELAY2_ADDR:-127.0.0.1:9103}"
consumer_addr="${DEV_CONSUMER_ADDR:-127.0.0.1:9102}"
webhook_addr="${DEV_WEBHOOK_ADDR:-127.0.0.1:8090}"
bin="${DEV_BIN:-bin}"
pidfile="$bin/dev.pid"

# running: the pid of a make dev of this checkout that is still running.
running() {
	local pid
	pid=$(cat "$pidfile" 2>/dev/null) || return 1
	[[ $(ps -o args= -p "$pid" 2>/dev/null) == *dev.sh* ]] && echo "$pid"
}

if [[ ${1:-} == stop ]]; then
	if ! pid=$(running); then
		echo "[dev] make dev is not running (no live pid in $pidfile)"
		exit 0
	fi
	echo "[dev] stopping make dev (pid $pid)"
	kill -TERM "$pid"
	for _ in $(seq 1 300); do
		kill -0 "$pid" 2>/dev/null || { echo "[dev] stopped"; exit 0; }
		sleep 0.1
	done
	echo "[dev] pid $pid is still running after 30s" >&2
	exit 1
elif [[ $# -gt 0 ]]; then
	echo "usage: scripts/dev.sh [stop]" >&2
	exit 2
fi
if pid=$(running); then
	echo "[dev] make dev is running already (pid $pid); make stop stops it" >&2
	exit 1
fi

echo "[dev] building into $bin/"
mkdir -p "$bin"
go build -o "$bin/" ./cmd/order-api ./cmd/outbox-relay ./cmd/order-consumer ./lab/webhook-receiver ./lab/rabbitmq-users
echo "[dev] migrating ${DATABASE_URL%%\?*}"
wal_role=false
[[ ${RELAY_MODE:-poll} == wal ]] && wal_role=true
MIGRATE_RELAY_WAL_ROLE=$wal_role "$bin/order-api" migrate up 2>&1 | sed -u 's/^/[migrate] /'
echo "[dev] creating the RabbitMQ users of deploy/rabbitmq/definitions.json"
amqp_users=$("$bin/rabbitmq-users" -prefix "${DEV_AMQP_USER_PREFIX:-}") # lines of: user AMQP URL
relay_amqp_url=$(awk '$1 == "orders-relay" {print $2}' <<<"$amqp_users")
consumer_amqp_url=$(awk '$1 == "orders-consumer" {print $2}' <<<"$amqp_users")
[[ -n $relay_amqp_url && -n $consumer_amqp_url ]] || { echo "[dev] rabbitmq-users named no orders-relay or orders-consumer" >&2; exit 1; }

# role_url ROLE: the DATABASE_URL setting of a process that connects as ROLE.
role_url() {
	if [[ ${DEV_DB_ROLES:-on} == off ]]; then
		echo "DATABASE_URL=$DATABASE_URL"
	else
		echo "DATABASE_URL=$(db_url_as "$DATABASE_URL" "$1")"
	fi
}
api_db=$(role_url orders_api)
relay_db=$(role_url orders_relay)
relay_wal_db=RELAY_WAL_$(role_url orders_relay_wal) # RELAY_WAL_DATABASE_URL=...
consumer_db=$(role_url orders_consumer)

echo $$ >"$pidfile"
trap 'rm -f "$pidfile"' EXIT
trap 'echo "[dev] stopping"; kill -TERM $(jobs -p) 2>/dev/null || true; wait; echo "[dev] stopped"' INT TERM

# supervise NAME VAR=value... -- BINARY: run BINARY with the variables,
# prefix its output with NAME, and start it again if it dies (a non-zero
# exit); stop it with SIGTERM when we stop.
supervise() {
	local name=$1
	shift
	local env=()
	while [[ $1 != "--" ]]; do
		env+=("$1")
		shift
	done
	shift
	(
		stop=""
		trap 'stop=1; kill -TERM $child 2>/dev/null' INT TERM
		while [[ -z $stop ]]; do
			# The prefixing sed ignores Ctrl-C: it must outlive the process
			# to pass on its last lines (a dead pipe would kill it mid-shutdown).
			env "${env[@]}" "$@" > >(trap '' INT && exec sed -u "s/^/[$name] /") 2>&1 &
			child=$!
			set +e
			wait $child
			code=$?
			wait $child 2>/dev/null # a trap interrupts the first wait
			set -e
			[[ -n $stop || $code -eq 0 ]] && break
			echo "[dev] $name exited ($code); starting it again in 1s"
			sleep 1
		done
	) &
}

supervise webhook  WEBHOOK_ADDR="$webhook_addr" FAIL_FIRST=1 -- "$bin/webhook-receiver"
# order-api checks bearer tokens with API_JWT_SECRET: unless .env or the
# environment sets another, the development secret (the Makefile's too),
# which `make token` signs with. Public, so the binaries take it in
# development only (DEV_MODE=true: scripts/env.sh).
supervise api      "$api_db" HTTP_ADDR="$api_addr" API_JWT_SECRET="${API_JWT_SECRET:-dev-only-order-api-jwt-secret-not-for-production}" -- "$bin/order-api"
supervise relay-1  "$relay_db" "$relay_wal_db" ADMIN_ADDR="$relay1_addr" RELAY_ID=relay-1 AMQP_URL="$relay_amqp_url" -- "$bin/outbox-relay"
supervise relay-2  "$relay_db" "$relay_wal_db" ADMIN_ADDR="$relay2_addr" RELAY_ID=relay-2 AMQP_URL="$relay_amqp_url" -- "$bin/outbox-relay"
# A short processing lease: after the walkthrough's crash, a webhook call cut
# off between its two steps is taken over after 10s instead of a minute.
supervise consumer "$consumer_db" ADMIN_ADDR="$consumer_addr" NOTIFY_WEBHOOK_URL="http://$webhook_addr/notifications" AMQP_URL="$consumer_amqp_url" \
	CONSUMER_FAULTS_ENDPOINT=true CONSUMER_PROCESSING_LEASE="${CONSUMER_PROCESSING_LEASE:-10s}" -- "$bin/order-consumer"

echo "[dev] running; Ctrl-C (or make stop) stops everything. Try: make walkthrough, and http://$api_addr/ui/"
[[ ${DEV_DB_ROLES:-on} == off ]] || echo "[dev] order-api, the relays and the consumer connect as orders_api, orders_relay and orders_consumer"
wait
