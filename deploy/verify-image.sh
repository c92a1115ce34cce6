#!/usr/bin/env bash
# Builds the relay's image from the Dockerfile as it is, with podman, and checks what the
# Dockerfile and docs/operations.md promise of it:
#
#   - the image: user 10001:10001, entrypoint, /data volume, stop signal; its size; every file
#     in it (the binary, the C runtime it links against, the CA bundle: no shell, no setuid
#     program);
#   - against PostgreSQL (a container on a network of its own): it runs as uid 10001 with a
#     read-only root filesystem and nothing writable mounted, migrates, delivers signed
#     webhooks to deploy/demo-receiver.py (signatures checked there), keeps ordering, retries
#     a 503, fails a 410, and answers /metrics, /healthz and /readyz through a published port;
#     SIGTERM stops it with exit code 0 well within 35s and the database lease is released;
#   - with SQLite (no database URL, the built-in default): it works on a named volume at /data,
#     stops the same way, and the rows are there for the next container.
#
#   deploy/verify-image.sh                 # build (from the layer cache when nothing changed), check
#   OUTBOX_RELAY_IMAGE=name deploy/verify-image.sh   # another tag (default localhost/outbox-relay:dev,
#                                          # the name docker-compose.yml builds)
#
# Needs podman (apt-get install podman buildah runc), python3 and curl. The base images are
# pulled by podman where a registry is reachable; where none is, run deploy/standin-images.sh
# first. Published ports are on 127.0.0.1, on ports the kernel finds free; every container,
# the network and the volume carry a label of this run and are removed on exit, whether the
# checks passed or not. The image is kept (deploy/verify-compose.sh uses it).
set -euo pipefail
# shellcheck source=deploy/podman/common.sh
source "$(dirname "$0")/podman/common.sh"

IMAGE=${OUTBOX_RELAY_IMAGE:-localhost/outbox-relay:dev}
RUN=outbox-relay-verify-$$
LABEL=org.outbox-relay.verify=$RUN
LEASE=outbox-relay-demo # lease.name in deploy/compose-relay.toml
DB_PASSWORD=verify-password

need podman "apt-get install podman buildah runc"
need python3 "apt-get install python3"
need curl "apt-get install curl"

cleanup() {
  local status=$?
  set +e
  local ids
  mapfile -t ids < <(podman ps -aq --filter "label=$LABEL")
  if [ ${#ids[@]} -gt 0 ]; then
    if [ "$status" != 0 ]; then
      # What the containers said, for the failure above.
      for id in "${ids[@]}"; do
        echo "--- last lines of $(podman inspect -f '{{.Name}}' "$id")" >&2
        podman logs --tail 15 "$id" >&2 2>&1
      done
    fi
    # -v: with the anonymous volumes podman made for the image's VOLUME, if any.
    podman rm -f -v -t 0 "${ids[@]}" >/dev/null
  fi
  podman network rm -f "$RUN" >/dev/null 2>&1
  settle_aardvark
  podman volume rm -f "$RUN-data" >/dev/null 2>&1
  [ -n "${cid:-}" ] && podman rm -f -v "$cid" >/dev/null 2>&1
  left=$(podman ps -aq --filter "label=$LABEL")
  [ -z "$left" ] || echo "cleanup: containers left: $left" >&2
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$(now_ms)

say "images this run uses"
for image in "$IMAGE_RUST" "$IMAGE_DEBIAN" "$IMAGE_POSTGRES" "$IMAGE_PYTHON"; do
  if ! podman image exists "$image"; then
    note "$image is not here: podman will try to pull it (where no registry is reachable, run deploy/standin-images.sh first)"
  fi
done
report_standins "$IMAGE_RUST" "$IMAGE_DEBIAN" "$IMAGE_POSTGRES" "$IMAGE_PYTHON"

say "podman build -t $IMAGE -f Dockerfile ."
t0=$(now_ms)
podman build -t "$IMAGE" -f "$REPO/Dockerfile" "$REPO" >"/tmp/$RUN-build.log" 2>&1 ||
  fail "the build failed; its last lines: $(tail -n 30 "/tmp/$RUN-build.log")"
build_s=$(((($(now_ms) - t0) + 500) / 1000))
if grep -q 'Compiling outbox-relay' "/tmp/$RUN-build.log"; then
  note "built in ${build_s}s (the release binary compiled)"
else
  note "built in ${build_s}s (every layer from the cache: nothing the build reads changed)"
fi
rm -f "/tmp/$RUN-build.log"

say "the image's configuration"
config=$(podman image inspect --format '{{json .Config}}' "$IMAGE")
python3 - "$config" <<'EOF'
import json, sys
c = json.loads(sys.argv[1])
want = {
    "User": "10001:10001",
    "Entrypoint": ["outbox-relay"],
    "Cmd": ["run"],
    "WorkingDir": "/data",
    "StopSignal": "SIGTERM",
}
bad = [f"{k} is {c.get(k)!r}, not {v!r}" for k, v in want.items() if c.get(k) != v]
if "/data" not in (c.get("Volumes") or {}):
    bad.append("/data is not a volume")
if "9090/tcp" not in (c.get("ExposedPorts") or {}):
    bad.append("9090/tcp is not exposed")
if "OUTBOX_RELAY__HTTP__LISTEN=0.0.0.0:9090" not in (c.get("Env") or []):
    bad.append("OUTBOX_RELAY__HTTP__LISTEN=0.0.0.0:9090 is not set")
if bad:
    sys.exit("image configuration: " + "; ".join(bad))
print("   user 10001:10001, entrypoint outbox-relay, cmd run, workdir and volume /data, port 9090, SIGTERM")
EOF

say "the image's files"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
compressed=$(podman save "$IMAGE" 2>/dev/null | gzip -6 | wc -c)
cid=$(podman create "$IMAGE")
podman export "$cid" >"/tmp/$RUN-rootfs.tar"
# -v: and the anonymous volume podman made for the image's VOLUME /data.
podman rm -v "$cid" >/dev/null
cid=
tar -tvf "/tmp/$RUN-rootfs.tar" | awk '$1 !~ /^d/ {print "   " $1, $2, $3, $6, $7, $8}'
python3 - "/tmp/$RUN-rootfs.tar" <<'EOF'
import sys, tarfile
t = tarfile.open(sys.argv[1])
members = t.getmembers()
files = [m for m in members if m.isfile()]
bad = []
for shell in ("bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox", "usr/bin/apt", "usr/bin/dpkg"):
    if any(m.name.lstrip("./") == shell for m in members):
        bad.append(f"{shell} is in the image")
setid = [m.name for m in files if m.mode & 0o6000]
if setid:
    bad.append(f"setuid/setgid files: {setid}")
data = [m for m in members if m.name.lstrip("./") == "data"]
if not data or data[0].uid != 10001 or data[0].gid != 10001:
    bad.append("/data is not owned by 10001:10001")
bundle = t.extractfile("etc/ssl/certs/ca-certificates.crt").read().decode()
certs = bundle.count("BEGIN CERTIFICATE")
if certs < 100:
    bad.append(f"the CA bundle holds only {certs} certificates")
if bad:
    sys.exit("image files: " + "; ".join(bad))
print(f"   {len(files)} files, no shell, no package manager, no setuid or setgid file; /data owned by 10001; CA bundle of {certs} certificates")
EOF
# The stand-in build image trusts the certificate authorities this machine's administrator
# added (deploy/standin/rust.Containerfile); the image must not.
for ca in /usr/local/share/ca-certificates/*.crt; do
  [ -f "$ca" ] || continue
  body=$(grep -v -- '-----' "$ca" | tr -d '\n' | cut -c 1-200)
  if tar -xOf "/tmp/$RUN-rootfs.tar" etc/ssl/certs/ca-certificates.crt | tr -d '\n' | grep -qF "$body"; then
    fail "the image's CA bundle holds this machine's local CA $ca"
  fi
done
rm -f "/tmp/$RUN-rootfs.tar"
note "size $((size / 1000 / 1000)) MB ($size bytes) uncompressed, $((compressed / 1000 / 1000)) MB as a gzipped archive"

# --- PostgreSQL ------------------------------------------------------------------------

say "PostgreSQL and the demo receiver on the network $RUN"
settle_aardvark
podman network create --label "$LABEL" "$RUN" >/dev/null
podman_run -d --name "$RUN-postgres" --label "$LABEL" --network "$RUN" --network-alias postgres \
  -e POSTGRES_USER=app -e POSTGRES_PASSWORD="$DB_PASSWORD" -e POSTGRES_DB=app \
  "$IMAGE_POSTGRES" >/dev/null
# start_receiver NAME: deploy/demo-receiver.py, reached by the relays as NAME:8080 (its network
# alias). One for each relay: it drops duplicates by webhook-id, which is the row id, and the
# SQLite relay's rows have the ids the PostgreSQL relay's had.
start_receiver() {
  podman_run -d --name "$RUN-$1" --label "$LABEL" --network "$RUN" --network-alias "$1" \
    --read-only -e PORT=8080 -e WEBHOOK_SECRET_FILE=/run/secrets/webhook_secret \
    -v "$REPO/deploy/demo-receiver.py:/app/demo-receiver.py:ro" \
    -v "$REPO/deploy/demo-webhook-secret.txt:/run/secrets/webhook_secret:ro" \
    "$IMAGE_PYTHON" python -u /app/demo-receiver.py >/dev/null
}
# receiver_events NAME: the receiver's JSON lines, one event per line.
receiver_events() { podman logs "$RUN-$1" 2>/dev/null | grep '^{' || true; }
# received NAME: how many deliveries it accepted.
received() { receiver_events "$1" | grep -c '"event": "received"' || true; }
start_receiver receiver
start_receiver receiver-sqlite
pin_bridge_mac "$RUN"
listening() { receiver_events "$1" | grep -c '"event": "listening"' || true; }
wait_for 30 "the receiver listening" is 1 listening receiver
wait_for 30 "the second receiver listening" is 1 listening receiver-sqlite
wait_for 15 "the network's DNS answering (aardvark-dns)" resolves "$RUN-receiver" postgres
# Over TCP: the entrypoint's first, socket-only server must not count as ready.
wait_for 60 "PostgreSQL ready" podman exec "$RUN-postgres" pg_isready -h 127.0.0.1 -U app -d app
# SQL as app over the server's socket (trusted there), from inside its container.
psql_app() { podman exec "$RUN-postgres" psql -U app -d app -tAc "$1"; }

# The relay's container as an operator runs it: the image's own user, --read-only, and no
# writable mount at all (podman's --read-only adds writable tmpfs on /tmp, /run and /var/tmp
# unless told not to; Docker's and Kubernetes' read-only root filesystem add none).
relay_args=(--label "$LABEL" --network "$RUN" --read-only --read-only-tmpfs=false
  -e OUTBOX_RELAY_CONFIG=/etc/outbox-relay/relay.toml
  -e OUTBOX_RELAY__DATABASE__MIGRATE=true
  -e OUTBOX_RELAY__LEASE__BACKEND=database
  -v "$REPO/deploy/compose-relay.toml:/etc/outbox-relay/relay.toml:ro"
  -v "$REPO/deploy/demo-webhook-secret.txt:/run/secrets/webhook_secret:ro")

# check_process CONTAINER: the relay's process, seen from the host, runs as 10001:10001, and
# the container has no writable mount.
check_process() {
  local pid uid gid
  pid=$(podman inspect -f '{{.State.Pid}}' "$1")
  uid=$(awk '/^Uid:/ {print $2 ":" $3 ":" $4 ":" $5}' "/proc/$pid/status")
  gid=$(awk '/^Gid:/ {print $2 ":" $3 ":" $4 ":" $5}' "/proc/$pid/status")
  [ "$uid" = 10001:10001:10001:10001 ] || fail "$1: the process's uids are $uid, not 10001"
  [ "$gid" = 10001:10001:10001:10001 ] || fail "$1: the process's gids are $gid, not 10001"
  [ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$1")" = true ] ||
    fail "$1: the root filesystem is not read-only"
  local rw
  rw=$(podman inspect -f '{{range .Mounts}}{{if .RW}}{{.Destination}} {{end}}{{end}}' "$1")
  note "process uid/gid 10001 (seen from the host), root filesystem read-only, writable mounts: ${rw:-none}"
}

# http_status PORT PATH: the HTTP status of GET http://127.0.0.1:PORT/PATH.
http_status() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1$2"; }

# enqueue CONTAINER CHANNEL PAYLOAD [--ordering-key K]: the image has no shell; its verbs are
# run directly with podman exec, with the container's environment and configuration.
enqueue() {
  local c=$1 channel=$2 payload=$3
  shift 3
  podman exec "$c" outbox-relay enqueue --channel "$channel" --payload "$payload" "$@" >/dev/null
}


# graceful_stop CONTAINER: podman stop (SIGTERM, 35s before SIGKILL, as the docs advise);
# prints the seconds it took; fails unless the exit code is 0 and the lease was released.
graceful_stop() {
  local t0 ms code
  t0=$(now_ms)
  podman stop -t 35 "$1" >/dev/null
  ms=$(($(now_ms) - t0))
  code=$(podman inspect -f '{{.State.ExitCode}}' "$1")
  [ "$code" = 0 ] || fail "$1 exited with $code after SIGTERM"
  podman logs "$1" 2>&1 | grep -q '"lease released"' || fail "$1 did not log \"lease released\""
  printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

say "the relay on PostgreSQL (database lease)"
pg_port=$(free_port)
# --image-volume ignore: no volume at /data either (podman and Docker would make an anonymous
# one for the image's VOLUME; Kubernetes makes none), so nothing at all is writable.
podman_run -d --name "$RUN-pg" -p "127.0.0.1:$pg_port:9090" "${relay_args[@]}" --image-volume ignore \
  -e OUTBOX_RELAY__DATABASE__URL="postgres://app:$DB_PASSWORD@postgres:5432/app" \
  -e OUTBOX_RELAY__RELAY__INSTANCE_ID=verify-postgres \
  "$IMAGE" >/dev/null
wait_for 60 "/readyz answering 200 on 127.0.0.1:$pg_port" is 200 http_status "$pg_port" /readyz
check_process "$RUN-pg"
[ "$(psql_app "SELECT count(*) FROM information_schema.tables WHERE table_name IN ('outbox', 'outbox_relay_lease')")" = 2 ] ||
  fail "the relay did not create its tables"
note "migrated: outbox and outbox_relay_lease created"
[ "$(http_status "$pg_port" /healthz)" = 200 ] || fail "/healthz did not answer 200"
note "/readyz and /healthz answer 200 on 127.0.0.1:$pg_port"

enqueue "$RUN-pg" demo '{"type":"order.created","order":1001}' --ordering-key order-1001
enqueue "$RUN-pg" demo '{"type":"order.paid","order":1001}' --ordering-key order-1001
enqueue "$RUN-pg" demo '{"type":"order.shipped","order":1001}' --ordering-key order-1001
enqueue "$RUN-pg" demo '{"type":"order.created","order":1003,"demo":"flaky"}'
enqueue "$RUN-pg" demo '{"type":"order.created","order":1004,"demo":"fail"}'
wait_for 60 "4 rows SUCCESS and 1 FAILED" is FAILED=1,SUCCESS=4 \
  psql_app "SELECT string_agg(status || '=' || n, ',' ORDER BY status) FROM (SELECT status, count(*) n FROM outbox GROUP BY status) s"
receiver_events receiver | check_deliveries 4
note "4 signed deliveries (signatures checked by the receiver), order-1001 in order, the 503 retried, the 410 FAILED"
podman exec "$RUN-pg" outbox-relay failed | grep -q '410' || fail "outbox-relay failed does not show the 410"
metrics=$(curl -sf --max-time 2 "http://127.0.0.1:$pg_port/metrics")
for line in 'outbox_relay_deliveries_total{sink="demo",outcome="delivered"} 4' \
  'outbox_relay_deliveries_total{sink="demo",outcome="permanent"} 1' \
  'outbox_relay_lease_held 1'; do
  grep -qF "$line" <<<"$metrics" || fail "/metrics has no line \"$line\""
done
note "/metrics: 4 delivered, 1 permanent, lease_held 1"

pg_stop=$(graceful_stop "$RUN-pg")
[ "$(psql_app "SELECT holder IS NULL AND lease_until IS NULL FROM outbox_relay_lease WHERE name = '$LEASE'")" = t ] ||
  fail "the lease row still names a holder after the stop"
note "SIGTERM: exited 0 in ${pg_stop}s, the lease row released (holder and lease_until NULL)"

# --- SQLite ----------------------------------------------------------------------------

say "the relay on SQLite (the built-in default) with a named volume at /data"
podman volume create --label "$LABEL" "$RUN-data" >/dev/null
sqlite_port=$(free_port)
podman_run -d --name "$RUN-sqlite" -p "127.0.0.1:$sqlite_port:9090" "${relay_args[@]}" \
  -v "$RUN-data:/data" -e OUTBOX_RELAY__RELAY__INSTANCE_ID=verify-sqlite \
  -e OUTBOX_RELAY__SINKS__DEMO__URL=http://receiver-sqlite:8080/hooks/demo \
  "$IMAGE" >/dev/null
wait_for 60 "/readyz answering 200 on 127.0.0.1:$sqlite_port" is 200 http_status "$sqlite_port" /readyz
check_process "$RUN-sqlite"
enqueue "$RUN-sqlite" demo '{"type":"order.created","order":2001}'
enqueue "$RUN-sqlite" demo '{"type":"order.created","order":2002}'
enqueue "$RUN-sqlite" log '{"hello":"sqlite"}'
wait_for 60 "2 signed deliveries from the SQLite relay" is 2 received receiver-sqlite
volume_dir=$(podman volume inspect -f '{{.Mountpoint}}' "$RUN-data")
owner=$(stat -c '%u:%g' "$volume_dir/outbox-relay.db")
[ "$owner" = 10001:10001 ] || fail "/data/outbox-relay.db is owned by $owner"
note "delivered; /data holds $(cd "$volume_dir" && echo *) (owner 10001:10001)"
sqlite_stop=$(graceful_stop "$RUN-sqlite")
lease_row=$(python3 - "$volume_dir/outbox-relay.db" "$LEASE" <<'EOF'
import sqlite3, sys
row = sqlite3.connect(sys.argv[1]).execute(
    "SELECT holder, lease_until FROM outbox_relay_lease WHERE name = ?", (sys.argv[2],)).fetchone()
print(row)
EOF
)
[ "$lease_row" = "(None, None)" ] || fail "the SQLite lease row after the stop: $lease_row"
note "SIGTERM: exited 0 in ${sqlite_stop}s, the lease row released"
# A verb as the container's command, on the same volume: the rows outlived the container.
status=$(podman run --rm --label "$LABEL" --read-only --read-only-tmpfs=false --network none \
  -v "$RUN-data:/data" "$IMAGE" status)
grep -Eq '^SUCCESS +demo +2$' <<<"$status" || fail "status on the volume afterwards: $status"
note "\`podman run --rm -v <volume>:/data $IMAGE status\` afterwards: SUCCESS demo 2"

say "passed in $(((($(now_ms) - started) + 500) / 1000))s"
note "image $IMAGE: $((size / 1000 / 1000)) MB uncompressed, $((compressed / 1000 / 1000)) MB gzipped; build ${build_s}s"
note "graceful stop: ${pg_stop}s on PostgreSQL, ${sqlite_stop}s on SQLite (limit given: 35s)"
