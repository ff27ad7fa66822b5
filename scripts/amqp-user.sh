#!/usr/bin/env bash
# scripts/amqp-user.sh: log a process in to RabbitMQ as its own user
# (deploy/rabbitmq/definitions.json, docs/messaging.md) rather than as
# AMQP_URL's user, an administrator.
#
#   scripts/amqp-user.sh USER COMMAND [ARGS...]   run COMMAND with AMQP_URL's user replaced by USER
#
# The password is RABBITMQ_PASSWORD_<USER> (RABBITMQ_PASSWORD_ORDERS_OPERATOR
# for orders-operator), else the user's dev password: its own name, as make
# dev (lab/rabbitmq-users) and docker compose's definitions set it. An empty
# USER leaves AMQP_URL as it is (make ctl OPERATOR_AMQP_USER= logs in as
# AMQP_URL's user). AMQP_URL unset: the local default. An AMQP_URL that
# lists the nodes of a cluster (URLs separated by commas) gets the user
# replaced in each.
set -euo pipefail
if [[ $# -lt 2 ]]; then
	echo "usage: scripts/amqp-user.sh USER COMMAND [ARGS...]" >&2
	exit 2
fi
user=$1
shift
url=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
if [[ -n $user ]]; then
	var=RABBITMQ_PASSWORD_$(tr 'a-z-' 'A-Z_' <<<"$user")
	password=${!var:-$user}
	IFS=, read -ra nodes <<<"$url"
	url=
	for node in "${nodes[@]}"; do
		node=${node#"${node%%[![:space:]]*}"} # leading spaces
		if [[ $node =~ ^(amqps?://)([^@/]*@)?(.*)$ ]]; then
			url+="${url:+,}${BASH_REMATCH[1]}$user:$password@${BASH_REMATCH[3]}"
		else
			echo "[amqp-user] AMQP_URL is not a URL (amqp://user:password@host/vhost, or several separated by commas): cannot log in as $user" >&2
			exit 1
		fi
	done
fi
export AMQP_URL=$url
exec "$@"
