# syntax=docker/dockerfile:1
#
# outbox-relay container image.
#
#   docker build -t outbox-relay .
#   docker run --rm --read-only -p 9090:9090 \
#     -e OUTBOX_RELAY__DATABASE__URL=postgres://app:pw@db:5432/app outbox-relay
#
# The final image holds one binary, the C library it links against (glibc, libm, libgcc_s),
# the CA bundle, and nothing else worth attacking: no shell, no package manager, no setuid
# program (about 23 MB). It runs as uid/gid 10001 and works with a read-only root filesystem:
# - PostgreSQL / MySQL / MariaDB: the relay writes nothing to disk; no writable path is needed.
# - SQLite (the built-in default, `outbox-relay.db` in the working directory): the working
#   directory is /data, declared as a volume; mount a writable volume there.
# /metrics, /healthz and /readyz listen on 0.0.0.0:9090 in the image (the binary's own default
# is 127.0.0.1:9090, which probes and scrapers outside the container cannot reach). The
# variable below sets that; environment variables override the config file, so change it with
# OUTBOX_RELAY__HTTP__LISTEN, not with http.listen in the file.
#
# Needs BuildKit (the default builder since Docker 23, and with `docker compose`) or
# podman/buildah: the build stage uses cache mounts. deploy/verify-image.sh builds it with
# podman and checks all of the above (docs/operations.md).

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

# The runtime files, gathered in /rootfs from Debian's slim image: the shared libraries the
# binary loads (whatever `ldd` names, so this works on any architecture: glibc, libm,
# libgcc_s and the loader), the CA bundle, and a passwd/group naming uid/gid 10001.
FROM debian:bookworm-slim AS runtime
# ca-certificates: webhook, FCM and vendor endpoints are verified against this trust store.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/outbox-relay /rootfs/usr/local/bin/outbox-relay
RUN ldd /rootfs/usr/local/bin/outbox-relay | grep -o '/[^ ]*' | sort -u \
      | xargs -I '{}' cp -L --parents '{}' /rootfs/ \
 && install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ca-certificates.crt \
 && printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
      'relay:x:10001:10001:outbox-relay:/data:/sbin/nologin' > /rootfs/etc/passwd \
 && printf '%s\n' 'root:x:0:' 'relay:x:10001:' > /rootfs/etc/group \
 && echo 'hosts: files dns' > /rootfs/etc/nsswitch.conf \
 && install -d -o 10001 -g 10001 -m 0750 /rootfs/data \
 && install -d -m 0755 /rootfs/etc/outbox-relay

# The image: those files on an empty base. No shell, no package manager, no setuid program:
# use `outbox-relay` itself as the container's command (`status`, `failed`, ...), and an
# ephemeral debug container (kubectl debug) to look around a running pod.
FROM scratch
COPY --from=runtime /rootfs/ /
# The commented reference of every key (changes nothing as shipped); mount your own file at
# /etc/outbox-relay/relay.toml and pass --config (or OUTBOX_RELAY_CONFIG).
COPY config/relay.toml /usr/share/doc/outbox-relay/relay.toml

ENV OUTBOX_RELAY__HTTP__LISTEN=0.0.0.0:9090 \
    SQLITE_TMPDIR=/data \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
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
