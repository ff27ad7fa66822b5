#!/usr/bin/env bash
# scripts/env.sh: the settings of .env, for the processes run from this
# checkout (make dev, make run, make run/relay, make run/consumer, make
# migrate, make walkthrough, make psql, make db/reset), in development
# (DEV_MODE=true, unless set).
#
#   scripts/env.sh COMMAND [ARGS...]   run COMMAND with .env's settings
#   source scripts/env.sh              export them into this shell (scripts/dev.sh)
#
# .env (at the root of the repository; copy .env.example) holds NAME=value
# lines; blank lines and lines starting with # are skipped, and a value may
# be wrapped in single or double quotes. A variable already set in the
# environment wins over .env, as with docker compose: `LOG_LEVEL=debug make
# run` overrides the file. DOTENV names another file; DOTENV=none reads
# none (the end-to-end tests set their own environment). With no .env,
# nothing changes.
#
# docker compose reads the same .env for its own ORDERS_* variables only
# (.env.example): when the file sets DATABASE_URL or AMQP_URL, env.sh says
# on stderr where they lead (password masked), so that a make ctl against
# another server than the one meant does not go unnoticed.

# masked URL: URL with its password, if any, replaced by ***; for a list
# of URLs separated by commas (AMQP_URL's nodes of a cluster), each one's.
masked() {
	local out= part
	IFS=, read -ra parts <<<"$1"
	for part in "${parts[@]}"; do
		if [[ $part =~ ^([[:space:]]*[a-zA-Z][a-zA-Z0-9+.-]*://[^:@/]*):[^@/]*@(.*)$ ]]; then
			part="${BASH_REMATCH[1]}:***@${BASH_REMATCH[2]}"
		fi
		out+="${out:+,}$part"
	done
	echo "$out"
}

# load_dotenv FILE: export every NAME=value of FILE not already set.
load_dotenv() {
	local file=$1 line name value n=0 urls=()
	while IFS= read -r line || [[ -n $line ]]; do
		line=${line%$'\r'}
		[[ $line =~ ^[[:space:]]*(#|$) ]] && continue
		line=${line#export }
		name=${line%%=*}
		value=${line#*=}
		if [[ $line != *=* || ! $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
			echo "[env] $file: skipping a line that is not NAME=value: $line" >&2
			continue
		fi
		if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
			value=${BASH_REMATCH[1]}
		fi
		[[ -n ${!name+set} ]] && continue
		export "$name=$value"
		n=$((n + 1))
		if [[ $name == DATABASE_URL || $name == AMQP_URL ]]; then
			urls+=("$name=$(masked "$value")")
		fi
	done <"$file"
	echo "[env] $n settings from $file" >&2
	for value in "${urls[@]}"; do
		echo "[env] $value (from $file): the host tools connect there; docker compose does not read it" >&2
	done
}

dotenv_file="${DOTENV:-$(dirname "${BASH_SOURCE[0]}")/../.env}"
if [[ $dotenv_file != none && -f $dotenv_file ]]; then
	load_dotenv "$dotenv_file"
fi
unset dotenv_file

# What runs from this checkout runs on a developer's machine: the binaries
# accept the development credentials (the JWT secret of make run and make
# token, the RabbitMQ passwords of make dev) and say so at start. Outside
# development they refuse them (docs/configuration.md, DEV_MODE).
export DEV_MODE="${DEV_MODE:-true}"

# Run as a command: run the rest of the command line with those settings.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	set -euo pipefail
	if [[ $# -eq 0 ]]; then
		echo "usage: scripts/env.sh COMMAND [ARGS...]" >&2
		exit 2
	fi
	exec "$@"
fi
