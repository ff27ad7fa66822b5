#!/bin/bash
# Patroni runs this once, on the node that initialises the cluster, with
# the server up and a connection string as $1: it creates the database
# (POSTGRES_DB) and runs the scripts of /docker-entrypoint-initdb.d, the
# roles of deploy/postgres/initdb/, as the official image does at its
# first start. The standby copies the result.
set -euo pipefail

psql -v ON_ERROR_STOP=1 "$1" -v db="${POSTGRES_DB:?}" <<'SQL'
CREATE DATABASE :"db";
SQL
for f in /docker-entrypoint-initdb.d/*.sh; do
	[[ -e $f ]] || continue
	echo "post-bootstrap.sh: running $f"
	"$f"
done
