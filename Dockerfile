# One image for every command of the order service (cmd/) and of its lab
# (lab/, the tools around it that docker compose runs too):
#   /usr/local/bin/order-api        HTTP API (:8080), the default ENTRYPOINT
#   /usr/local/bin/outbox-relay     outbox publisher (admin :9101)
#   /usr/local/bin/order-consumer   consumers (admin :9102)
#   /usr/local/bin/orderctl         the operator's tool (docs/operations.md)
#   /usr/local/bin/webhook-receiver demo notification receiver (:8090), lab/
#   /usr/local/bin/walkthrough      guided tour and smoke test of a running stack, lab/
#   (and the lab's other commands, which compose does not run)
# docker compose picks the binary per service with `entrypoint:`, e.g.
#   entrypoint: ["/usr/local/bin/outbox-relay"]
# and arguments with `command:`, e.g. command: ["migrate", "up"].
#
#   docker build -t orders .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=... orders -migrate
#
# No `# syntax=` line, on purpose: it makes every build fetch a Dockerfile
# frontend image from a registry before reading this file, so builds fail
# behind a proxy, offline or with a registry outage. Everything here
# (stages, FROM --platform, RUN --mount=type=cache) is in the frontend that
# BuildKit has built in, the default builder of Docker Engine 23 and later.
# deploy/dockerfile_test.go keeps it that way.
#
# Images are named by tag, and a tag names a version but is not a pin: the
# registry may move it (rebuilds with security fixes). To pin, append the
# digest your registry reports (docker buildx imagetools inspect IMAGE:TAG),
# e.g. golang:1.26.8-bookworm@sha256:..., and let a bot such as Renovate
# update it.

# ---- build ------------------------------------------------------------------
# The Go of go.mod (1.26), at a patch release. Built on the host's platform and
# cross-compiled to the target's: fast multi-arch builds, no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src

# Modules first: this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

# Then the source (.dockerignore keeps the context to what the build needs).
COPY . .
# Static binaries (no cgo: the final image has no libc), without local paths
# or debug symbols. The build cache mount speeds up rebuilds (BuildKit).
# ./cmd/... ./lab/... so that a new command is in the image without editing
# this file. A team that deletes lab/ removes ./lab/... here (lab/README.md).
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/... ./lab/...

# ---- run --------------------------------------------------------------------
# Distroless static: CA certificates, tzdata and /etc/passwd, no shell, no
# package manager; runs as uid 65532. The nonroot tag follows Debian 12's
# updates: it is not a version (a digest would pin it, see above).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
# order-api, outbox-relay admin, order-consumer admin, webhook-receiver
EXPOSE 8080 9101 9102 8090
ENTRYPOINT ["/usr/local/bin/order-api"]
