#!/usr/bin/env bash
# scripts/db-role.sh: connect a process as its own PostgreSQL role
# (migrations/00008_roles.sql, docs/security.md) rather than as
# DATABASE_URL's user, who owns the schema and migrates it.
#
#   scripts/db-role.sh ROLE COMMAND [ARGS...]   run COMMAND with DATABASE_URL's user replaced by ROLE
#   source scripts/db-role.sh                   define db_url_as (scripts/dev.sh)
#
# DATABASE_URL unset: the local default of make dev. An empty ROLE leaves
# DATABASE_URL as it is (make ctl OPERATOR_ROLE= connects as its user). The
# password, if any, is dropped: the roles the migration creates have none,
# and log in where pg_hba.conf trusts them, as on a local development
# server. DATABASE_URL must be a URL (postgres://...), not key=value pairs.

# db_url_as URL ROLE: URL with its user (and password) replaced by ROLE.
db_url_as() {
	local url=$1 role=$2
	if [[ -z $role ]]; then
		echo "$url"
	elif [[ $url =~ ^([a-zA-Z][a-zA-Z0-9+.-]*://)([^@/]*@)?(.*)$ ]]; then
		echo "${BASH_REMATCH[1]}$role@${BASH_REMATCH[3]}"
	else
		echo "[db-role] DATABASE_URL is not a URL (postgres://user@host/db): cannot connect as $role" >&2
		return 1
	fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	set -euo pipefail
	if [[ $# -lt 2 ]]; then
		echo "usage: scripts/db-role.sh ROLE COMMAND [ARGS...]" >&2
		exit 2
	fi
	role=$1
	shift
	DATABASE_URL=$(db_url_as "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/orders?sslmode=disable}" "$role")
	export DATABASE_URL
	exec "$@"
fi
