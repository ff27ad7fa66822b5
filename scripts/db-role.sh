#!/usr/bin/env bash
# scripts/db-role.sh: connect a process as its own PostgreSQL role
# (migrations/00008_roles.sql, docs/security.md) rather than as
# DATABASE_URL's user, who owns the schema and migrates it.
#
#   scripts/db-role.sh ROLE COMMAND [ARGS...]   run COMMAND with DATABASE_URL's user replaced by ROLE
#   source scripts/db-role.sh                   define db_url_as (scripts/dev.sh)
#
# DATABASE_URL unset: the local default of make dev. An empty ROLE leaves
# DATABASE_URL as it is (make ctl OPERATOR_ROLE= connects as its user).
# The password:
#   - DATABASE_URL's user is ROLE already: the URL is kept whole, password
#     and all (DATABASE_URL=postgres://orders_operator:<its password>@...
#     for docker compose's server: docker compose run --rm --no-deps
#     secrets show db-orders_operator);
#   - DB_PASSWORD_<ROLE> is set (DB_PASSWORD_ORDERS_OPERATOR for
#     orders_operator): that password, as it goes into a URL (letters,
#     digits and - _ . ~ need no escaping);
#   - otherwise none: the URL's password is its user's, not ROLE's, and is
#     dropped, with a line on stderr that says so. The roles the migration
#     creates have no password, and log in where pg_hba.conf trusts them,
#     as on a local development server.
# DATABASE_URL must be a URL (postgres://...), not key=value pairs.

# db_url_as URL ROLE: URL with its user (and password) replaced by ROLE's.
db_url_as() {
	local url=$1 role=$2 scheme userinfo rest user var
	if [[ -z $role ]]; then
		echo "$url"
		return
	fi
	if [[ ! $url =~ ^([a-zA-Z][a-zA-Z0-9+.-]*://)(([^@/]*)@)?(.*)$ ]]; then
		echo "[db-role] DATABASE_URL is not a URL (postgres://user@host/db): cannot connect as $role" >&2
		return 1
	fi
	scheme=${BASH_REMATCH[1]} userinfo=${BASH_REMATCH[3]} rest=${BASH_REMATCH[4]}
	user=${userinfo%%:*}
	var=DB_PASSWORD_$(tr 'a-z-' 'A-Z_' <<<"$role")
	if [[ $user == "$role" ]]; then
		echo "$url"
	elif [[ -n ${!var:-} ]]; then
		echo "$scheme$role:${!var}@$rest"
	else
		if [[ $userinfo == *:* ]]; then
			echo "[db-role] connecting as $role without a password: DATABASE_URL's is ${user:-its user}'s, not $role's. Where the server asks for one (docker compose's does), set $var, or put $role's own URL in DATABASE_URL." >&2
		fi
		echo "$scheme$role@$rest"
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
