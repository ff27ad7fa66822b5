# The order service: transactional outbox and consumer inbox on PostgreSQL
# and RabbitMQ. `make` lists the targets. walkthrough, load, bench/flow and
# soak (and make dev's webhook receiver) run the tools of lab/, which a team
# may delete (lab/README.md).

SHELL := /bin/bash
.DEFAULT_GOAL := help

GO      ?= go
TOOL    := $(GO) tool -modfile=tools/go.mod
PKGS    := ./...
# DATABASE_URL and AMQP_URL come from the environment; unset, the binaries
# use the local servers, and the tests use them or start containers.
# The targets that run the service or talk to its database (dev, run*,
# migrate, walkthrough, psql, db/reset, ctl, replay) also read .env when it
# exists, under
# the environment (scripts/env.sh); the tests do not.
ENV     := ./scripts/env.sh
# orderctl (make ctl, make replay) and the walkthrough connect as the
# operators' role, DATABASE_URL's user replaced (scripts/db-role.sh,
# docs/security.md), with DB_PASSWORD_ORDERS_OPERATOR's password if set (a
# DATABASE_URL of orders_operator itself is kept whole); OPERATOR_ROLE=
# keeps DATABASE_URL's user.
# They log in to RabbitMQ as their own users too, AMQP_URL's user replaced
# (scripts/amqp-user.sh, docs/messaging.md): orderctl as orders-operator, the
# walkthrough as orders-walkthrough; OPERATOR_AMQP_USER= and
# WALKTHROUGH_AMQP_USER= keep AMQP_URL's user.
OPERATOR_ROLE         ?= orders_operator
OPERATOR_AMQP_USER    ?= orders-operator
WALKTHROUGH_AMQP_USER ?= orders-walkthrough
AS_OPERATOR    := ./scripts/db-role.sh "$(OPERATOR_ROLE)" ./scripts/amqp-user.sh "$(OPERATOR_AMQP_USER)"
AS_WALKTHROUGH := ./scripts/db-role.sh "$(OPERATOR_ROLE)" ./scripts/amqp-user.sh "$(WALKTHROUGH_AMQP_USER)"

# The secret of order-api's bearer tokens under make dev, make run, make
# token, make walkthrough and make load, unless API_JWT_SECRET is set (in
# .env or the environment). A development secret, public in this file
# (scripts/dev.sh has the same), so the binaries refuse it outside
# development (DEV_MODE; the make targets run in development:
# scripts/env.sh). docker compose makes a secret of its own.
# WITH_DEV_SECRET runs a command with .env and this default.
DEV_JWT_SECRET  := dev-only-order-api-jwt-secret-not-for-production
WITH_DEV_SECRET := $(ENV) sh -c 'API_JWT_SECRET="$${API_JWT_SECRET:-$(DEV_JWT_SECRET)}" exec "$$@"' --
# make load: the rate (orders/s) and duration of the load generator;
# make bench/flow: its rates, the duration of each run, how many
# outbox-relays and MESSAGE_PARTITIONS (0: none);
# make bench/cost: its rate, and the git revision it runs against;
# make bench/api: the clients of the closed loops, and a git revision
# whose order-api runs too (none when empty);
# make bench/volume: how many orders of history (5 outbox and inbox rows each);
# make bench/horizon: how long the horizon is held;
# make soak: how long it runs;
# make failover: how many failovers, in which relay modes, at what rate.
RATE          ?= 20
RATES         ?= 50,100,150
DURATION      ?= 20s
RELAYS        ?= 2
PARTITIONS    ?= 0
COST_RATE     ?= 100
CLIENTS       ?= 8
API_AGAINST   ?=
AGAINST       ?= main
VOLUME_ORDERS ?= 1000000
HOLD          ?= 10m
SOAK_DURATION ?= 10m
FAILOVERS     ?= 10
FAILOVER_MODE ?= both
FAILOVER_RATE ?= 10

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_\/-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## run every test against the local PostgreSQL and RabbitMQ (or containers), the relay's suite once per RELAY_MODE
	$(MAKE) --no-print-directory -j2 test/packages test/wal

.PHONY: test/packages
test/packages: ## every package's tests, the relay's with the polling relay (RELAY_MODE=poll)
	$(GO) test -count=1 -timeout 15m $(PKGS)

.PHONY: test/wal
test/wal: ## the relay suite, and the change of partitions end to end, with the log-tailing relay (RELAY_MODE=wal), against a wal_level=logical PostgreSQL the tests start
	OUTBOX_TEST_RELAY_MODE=wal $(GO) test -count=1 -timeout 15m ./internal/messaging/outbox/wal/
	OUTBOX_TEST_RELAY_MODE=wal $(GO) test -count=1 -timeout 10m -run '^TestChangingThePartitionsLosesAndReordersNothing$$/^wal$$' ./test/e2e/

.PHONY: test/ha
test/ha: ## the flow through 10 PostgreSQL failovers per relay mode (kill, switchover) and an asynchronous standby's, under Patroni (Debian's patroni and etcd-server): minutes
	ORDERS_TEST_HA=1 $(GO) test -count=1 -timeout 15m -parallel 3 -run '^(TestAPrimaryDiesUnderLoad|TestAnAsyncPrimaryDiesUnderLoad)$$' -v ./test/e2e/

.PHONY: test/unit
test/unit: ## the tests that need no servers (go test -short: those needing PostgreSQL or RabbitMQ skip)
	$(GO) test -short -count=1 $(PKGS)

.PHONY: test/race
test/race: ## run every test with the race detector
	$(GO) test -count=1 -race -timeout 20m $(PKGS)

.PHONY: bench
bench: ## the benchmarks of docs/benchmarks.md (relay against a raw publisher, latency)
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 20m ./internal/...

.PHONY: bench/relay
bench/relay: ## the polling relay, the log-tailing relay and a raw amqp091 publisher on the same backlog: their ratios
	$(GO) test -run '^$$' -bench 'BenchmarkRelayModes' -benchtime 1x -timeout 20m ./internal/messaging/outbox/wal/

.PHONY: bench/flow
bench/flow: ## the whole flow on a fresh database and vhost at RATES orders/s, DURATION each, with RELAYS relays and PARTITIONS: latency, CPU per 1,000 orders
	$(GO) run ./lab/bench-flow -rates $(RATES) -duration $(DURATION) -relays $(RELAYS) -partitions $(PARTITIONS)

.PHONY: bench/cost
bench/cost: ## an order's cost per hop (CPU, transactions, statements, rows, WAL, fsyncs), this checkout against AGAINST (main) built from git, alternately: the ratios
	$(GO) run ./lab/bench-flow -rates $(COST_RATE) -duration $(DURATION) -relays $(RELAYS) -partitions $(PARTITIONS) -against $(AGAINST)

.PHONY: bench/api
bench/api: ## order-api as built (auth on, Idempotency-Keys, loadgen in a process of its own) against a raw pgx loop, CLIENTS at a time, alternately: both rates and the ratio (API_AGAINST=main adds that revision's API)
	$(GO) run ./lab/bench-flow -closed $(CLIENTS) $(if $(API_AGAINST),-against $(API_AGAINST))

.PHONY: bench/volume
bench/volume: ## the hot paths on a year of history (VOLUME_ORDERS orders: 5 outbox and 5 inbox rows each, made in PostgreSQL) against an empty database: the ratios
	$(GO) run ./lab/bench-volume -orders $(VOLUME_ORDERS)

.PHONY: bench/horizon
bench/horizon: ## each relay mode's drain rate after a session idle in transaction held the xmin horizon for HOLD under a steady load, over its rate before: the ratios
	$(GO) run ./lab/bench-volume -horizon $(HOLD)

.PHONY: soak
soak: ## the whole flow for SOAK_DURATION under kills, cut connections and a read-only database; fails if anything is lost, doubled or stuck
	$(GO) run ./lab/soak -duration $(SOAK_DURATION)

.PHONY: failover
failover: ## FAILOVERS PostgreSQL failovers (kill, switchover in turn) under Patroni at FAILOVER_RATE orders/s, per relay mode (FAILOVER_MODE poll, wal, both): seconds to recover, lost, ghosts
	$(GO) run ./lab/failover -n $(FAILOVERS) -mode $(FAILOVER_MODE) -rate $(FAILOVER_RATE)

.PHONY: lint
lint: ## gofmt, go vet and golangci-lint (the first run builds the linter: minutes)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)
	$(TOOL) golangci-lint run $(PKGS)

.PHONY: generate
generate: ## regenerate the sqlc code (store, outbox, inbox queries), and api/asyncapi.yaml and docs/catalog.md (go generate ./api)
	$(TOOL) sqlc generate
	$(GO) generate ./api

.PHONY: migrate
migrate: ## create the database if needed and apply the migrations (DATABASE_URL)
	$(ENV) $(GO) run ./cmd/order-api migrate up

.PHONY: run
run: ## run order-api against DATABASE_URL, migrating first (tokens: make token)
	$(WITH_DEV_SECRET) $(GO) run ./cmd/order-api -migrate

.PHONY: run/relay
run/relay: ## run outbox-relay against DATABASE_URL and AMQP_URL
	$(ENV) $(GO) run ./cmd/outbox-relay

.PHONY: run/consumer
run/consumer: ## run order-consumer against DATABASE_URL and AMQP_URL
	$(ENV) $(GO) run ./cmd/order-consumer

.PHONY: dev
dev: ## the whole system on this machine without Docker (migrations, api, 2 relays, consumer, webhook receiver); Ctrl-C or make stop stops it
	./scripts/dev.sh

.PHONY: stop
stop: ## stop what make dev started (from another terminal)
	./scripts/dev.sh stop

.PHONY: psql
psql: ## psql on DATABASE_URL (the orders database of make dev by default)
	$(ENV) sh -c 'exec psql "$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/orders?sslmode=disable}"'

.PHONY: ctl
ctl: ## orderctl, the operator's tool, as orders_operator on DATABASE_URL's database, and AMQP_URL: make ctl ARGS='status'
	$(ENV) $(AS_OPERATOR) $(GO) run ./cmd/orderctl $(ARGS)

.PHONY: token
token: ## a bearer token for order-api, signed with its (development) secret: make token ARGS=-operator, ARGS='-customer c-1 -ttl 8h'
	@$(WITH_DEV_SECRET) $(GO) run ./cmd/orderctl token $(ARGS)

.PHONY: replay
replay: ## move a consumer's parked messages back to its work queue: make replay CONSUMER=fulfillment REASON='why' [PAST_WINDOW=1: also those older than CONSUMER_REPLAY_WINDOW]
	@test -n "$(CONSUMER)" || { echo "usage: make replay CONSUMER=<consumer> REASON='why' [PAST_WINDOW=1]"; exit 2; }
	$(ENV) $(AS_OPERATOR) $(GO) run ./cmd/orderctl parked replay $(CONSUMER) --all $(if $(PAST_WINDOW),--past-window) --reason "$(REASON)"

.PHONY: compose-test
compose-test: ## the demo stack in Docker: up --build --wait, the walkthrough inside it (-yes), always down -v; COMPOSE_SERVICES= to start a subset
	./scripts/compose-test.sh $(COMPOSE_SERVICES)

.PHONY: walkthrough
walkthrough: ## a guided tour of the system make dev runs; ARGS=-yes runs it unattended (compose: make compose-test)
	$(WITH_DEV_SECRET) $(AS_WALKTHROUGH) $(GO) run ./lab/walkthrough $(ARGS)

.PHONY: load
load: ## post orders to the running API at RATE orders/s for DURATION and report latency (ARGS=-chart latency.svg)
	$(WITH_DEV_SECRET) $(GO) run ./lab/loadgen -rate $(RATE) -duration $(DURATION) $(ARGS)

.PHONY: db/reset
db/reset: ## roll every migration back and apply them again (drops all data!)
	$(ENV) $(GO) run ./cmd/order-api migrate reset
