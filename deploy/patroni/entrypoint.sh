#!/bin/bash
# Starts Patroni on /etc/patroni/orders.yml with what differs between the
# nodes: the name (PATRONI_NAME, also the host name the other node and
# etcd reach it by) and the superuser's password, from the file of
# POSTGRES_PASSWORD_FILE (the stack's secrets volume).
set -euo pipefail

: "${PATRONI_NAME:?set PATRONI_NAME, the node name and the host name it is reached by}"
if [[ ! -s ${POSTGRES_PASSWORD_FILE:-/nonexistent} ]]; then
	echo "entrypoint.sh: POSTGRES_PASSWORD_FILE names no file with a password (${POSTGRES_PASSWORD_FILE:-unset})" >&2
	exit 1
fi
password=$(<"$POSTGRES_PASSWORD_FILE")
export PATRONI_RESTAPI_CONNECT_ADDRESS="$PATRONI_NAME:8008"
export PATRONI_POSTGRESQL_CONNECT_ADDRESS="$PATRONI_NAME:5432"
for user in SUPERUSER REPLICATION REWIND; do
	export "PATRONI_${user}_USERNAME=postgres" "PATRONI_${user}_PASSWORD=$password"
done
exec patroni /etc/patroni/orders.yml
