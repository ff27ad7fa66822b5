#!/usr/bin/env bash
# make compose-test: the demo stack in Docker, end to end, unattended.
#
#   1. docker compose up --build -d --wait   build the image, start the stack,
#                                            wait until every service is healthy
#   2. docker compose run --rm walkthrough -yes   the guided tour, inside the
#                                            compose network; it exits 1 when
#                                            the system misbehaves
#   3. docker compose down -v                always, pass or fail: no container
#                                            or volume is left behind
#
# The exit status is the first failure's: up's, else the walkthrough's.
#
# Compose files: docker-compose.yml and docker-compose.demo.yml, plus any
# override that COMPOSE_FILE names in the environment (e.g.
# COMPOSE_FILE=docker-compose.yml:my.override.yml). Arguments name the
# services to start (default: all); the host ports move with ORDERS_*_PORT
# (see .env.example). Needs a Docker engine with Compose v2.
set -euo pipefail
cd "$(dirname "$0")/.."

files="${COMPOSE_FILE:-docker-compose.yml}"
case ":$files:" in
*:docker-compose.demo.yml:*) ;;
*) files="$files:docker-compose.demo.yml" ;;
esac
export COMPOSE_FILE="$files"
wait_timeout="${COMPOSE_WAIT_TIMEOUT:-600}"

say() { printf '[compose-test] %s\n' "$*"; }

down() {
	local code=$?
	trap - EXIT INT TERM
	say "docker compose down -v"
	docker compose --profile demo down -v --remove-orphans || true
	if [[ $code -eq 0 ]]; then
		say "PASS in $((SECONDS - started))s"
	else
		say "FAIL (exit $code) after $((SECONDS - started))s"
	fi
	exit "$code"
}

started=$SECONDS
say "COMPOSE_FILE=$COMPOSE_FILE"
trap down EXIT
trap 'exit 130' INT TERM

say "docker compose up --build -d --wait ${*:-(every service)}"
docker compose up --build -d --wait --wait-timeout "$wait_timeout" "$@"
say "up and healthy after $((SECONDS - started))s"

tour=$SECONDS
say "docker compose run --rm walkthrough -yes"
docker compose run --rm -T walkthrough -yes
say "walkthrough passed in $((SECONDS - tour))s"
