# syntax=docker/dockerfile:1
#
# outbox-relay container image.
#
#   docker build -t outbox-relay .
#   docker run --rm --read-only -p 9090:9090 \
#     -e OUTBOX_RELAY__DATABASE__URL=postgres://app:pw@db:5432/app outbox-relay
#
# The final image holds one binary, the CA bundle and nothing else worth attacking. It runs as
# uid/gid 10001 and works with a read-only root filesystem:
# - PostgreSQL / MySQL / MariaDB: the relay writes nothing to disk; no writable path is needed.
# - SQLite (the built-in default, `outbox-relay.db` in the working directory): the working
#   directory is /data, declared as a volume; mount a writable volume there.
# /metrics, /healthz and /readyz listen on 0.0.0.0:9090 in the image (the binary's own default
# is 127.0.0.1:9090, which probes and scrapers outside the container cannot reach). The
# variable below sets that; environment variables override the config file, so change it with
# OUTBOX_RELAY__HTTP__LISTEN, not with http.listen in the file.
#
# Needs BuildKit (the default builder since Docker 23, and with `docker compose`): the build
# stage uses cache mounts.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The patched sqlx-core that Cargo.toml's [patch.crates-io] points at (vendor/README.md).
COPY vendor ./vendor
# benches/ only because Cargo.toml declares a bench target; tests are not built.
COPY benches ./benches
# Build settings for dependencies (the bundled SQLite's compile options).
COPY .cargo ./.cargo
# The cache mounts keep the registry and compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin outbox-relay \
 && install -D -m 0755 target/release/outbox-relay /out/outbox-relay

FROM debian:bookworm-slim
# ca-certificates: webhook, FCM and vendor endpoints are verified against the OS trust store.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 relay \
 && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin relay \
 && install -d -o 10001 -g 10001 -m 0750 /data \
 && install -d -m 0755 /etc/outbox-relay
COPY --from=build /out/outbox-relay /usr/local/bin/outbox-relay
# The commented reference of every key (changes nothing as shipped); mount your own file at
# /etc/outbox-relay/relay.toml and pass --config (or OUTBOX_RELAY_CONFIG).
COPY config/relay.toml /usr/share/doc/outbox-relay/relay.toml

ENV OUTBOX_RELAY__HTTP__LISTEN=0.0.0.0:9090 \
    SQLITE_TMPDIR=/data
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 9090
# SIGTERM (the default stop signal) is a graceful stop: in-flight sends finish within
# relay.shutdown_timeout (25s by default), then the lease is released. Give the container
# more than that to stop (docker stop -t 35, compose stop_grace_period, Kubernetes
# terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
