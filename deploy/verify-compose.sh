#!/usr/bin/env bash
# Brings the compose demo (docker-compose.yml) up with podman-compose, checks what
# docs/operations.md says it shows, and takes it all down again:
#
#   - the one-shot migrate and seed finish with exit code 0;
#   - the demo receiver gets signed deliveries (it checks each signature), order-1001 in
#     order, the flaky row refused once with 503 and then delivered, the 410 row FAILED
#     (`outbox-relay status` and `failed`, run in a relay container), and `requeue` sends it
#     again;
#   - exactly one relay holds the Redis lease (/metrics of both, from the host); Prometheus
#     scrapes both and has the alert rules loaded;
#   - a graceful stop of the holder (SIGTERM) exits 0 and the other relay takes the lease
#     over, and delivers a row enqueued after that; after a SIGKILL of the holder the other
#     takes it over once the Redis key's TTL (lease.ttl) runs out;
#   - the traffic profile's service inserts rows that are delivered, and stops on SIGTERM;
#   - `down -v` leaves no container, pod, network or volume of the project.
#
#   deploy/verify-compose.sh
#
# Runs under its own project name (outbox-relay-verify, not the demo's outbox-relay-demo) with
# the published ports on 127.0.0.1, on ports the kernel finds free; cleans up on exit, passed
# or not. Needs podman, podman-compose 1.1 or later (Debian bookworm's 1.0.3 honours neither
# depends_on conditions nor profiles: python3 -m pip install 'podman-compose>=1.1'; or set
# PODMAN_COMPOSE to the command), python3 and curl; the images as for deploy/verify-image.sh
# (deploy/standin-images.sh where no registry is reachable). The relay image is built by
# `podman-compose build`, from the layer cache when deploy/verify-image.sh built it already.
set -euo pipefail
# shellcheck source=deploy/podman/common.sh
source "$(dirname "$0")/podman/common.sh"

PROJECT=outbox-relay-verify
need podman "apt-get install podman buildah runc"
need python3 "apt-get install python3"
need curl "apt-get install curl"

# A podman-compose of at least 1.1: $PODMAN_COMPOSE, the one on the PATH, or the Python module.
pc_version() { "$@" --version 2>/dev/null | sed -n 's/^podman-compose version \([0-9.]*\).*/\1/p'; }
PC=()
for candidate in "${PODMAN_COMPOSE:-}" podman-compose "python3 -m podman_compose"; do
  [ -n "$candidate" ] || continue
  read -r -a cmd <<<"$candidate"
  version=$(pc_version "${cmd[@]}")
  if [ -n "$version" ] && [ "$(printf '%s\n1.1.0\n' "$version" | sort -V | head -n 1)" = 1.1.0 ]; then
    PC=("${cmd[@]}")
    break
  fi
done
[ ${#PC[@]} -gt 0 ] || fail "no podman-compose 1.1 or later: python3 -m pip install 'podman-compose>=1.1' (or set PODMAN_COMPOSE)"

# compose ARGS...: podman-compose on this project, with the traffic profile's service known
# (for stop and down); never for more than 2 minutes (a podman that waits for ever must not
# keep the run, and its cleanup, from ending).
compose() {
  timeout 120 "${PC[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" --profile traffic "$@"
}
# container SERVICE: the name of the service's container.
container() {
  podman ps -a --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -n 1
}
project_containers() { podman ps -aq --filter "label=com.docker.compose.project=$PROJECT"; }
# The volumes the project's containers use, named or anonymous (podman-compose's down -v
# removes only the named ones; the images' VOLUMEs leave anonymous ones).
project_volumes() {
  local id
  for id in $(project_containers); do
    podman inspect -f '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}}{{"\n"}}{{end}}{{end}}' "$id"
  done | sort -u
}
leftovers() {
  local c p n v
  c=$(project_containers | wc -l)
  p=$(podman pod ls -q --filter "name=pod_$PROJECT" | wc -l)
  n=$(podman network ls -q --filter "name=^${PROJECT}_" | wc -l)
  v=$(podman volume ls -q --filter "name=^${PROJECT}_" | wc -l)
  echo "containers $c, pods $p, networks $n, project volumes $v"
}

VOLUMES=""
cleanup() {
  local status=$?
  set +e
  if [ -n "$(project_containers)" ]; then
    if [ "$status" != 0 ]; then
      for id in $(project_containers); do
        echo "--- last lines of $(podman inspect -f '{{.Name}}' "$id")" >&2
        podman logs --tail 15 "$id" >&2 2>&1
      done
    fi
    VOLUMES="$VOLUMES $(project_volumes)"
    compose down -v -t 5 >/dev/null 2>&1
  fi
  for v in $VOLUMES; do podman volume rm -f "$v" >/dev/null 2>&1; done
  podman pod rm -f "pod_$PROJECT" >/dev/null 2>&1
  podman network rm -f "${PROJECT}_default" >/dev/null 2>&1
  settle_aardvark
  exit "$status"
}

[ -z "$(project_containers)" ] ||
  fail "containers of the project $PROJECT exist already (an earlier run?): ${PC[*]} -p $PROJECT down -v"
trap cleanup EXIT
trap 'exit 130' INT TERM
started=$(now_ms)

say "images this run uses"
report_standins "$IMAGE_POSTGRES" "$IMAGE_REDIS" "$IMAGE_PYTHON" "$IMAGE_PROMETHEUS" \
  "$IMAGE_RUST" "$IMAGE_DEBIAN"
note "podman-compose $(pc_version "${PC[@]}"), $(podman --version)"

DEMO_PROMETHEUS_PORT=$(free_port)
DEMO_RELAY_1_PORT=$(free_port)
DEMO_RELAY_2_PORT=$(free_port)
export DEMO_PROMETHEUS_PORT DEMO_RELAY_1_PORT DEMO_RELAY_2_PORT
declare -A PORT=([relay-1]=$DEMO_RELAY_1_PORT [relay-2]=$DEMO_RELAY_2_PORT)

say "podman-compose build"
t0=$(now_ms)
timeout 900 "${PC[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" build >"/tmp/$PROJECT-build.log" 2>&1 ||
  fail "podman-compose build failed: $(tail -n 30 "/tmp/$PROJECT-build.log")"
rm -f "/tmp/$PROJECT-build.log"
note "$(((($(now_ms) - t0) + 500) / 1000))s"

say "podman-compose up -d, in dependency order"
# Podman 4.3 (Debian bookworm's) cannot run `up` of this file in one go: podman before 4.6
# cannot wait for a container to be healthy (podman-compose then ignores service_healthy),
# and `podman start` of a container whose dependency has dependencies of its own fails
# ("depends on container ... not found in input list"; fixed upstream in 2025, podman pull
# request 26193). So each stage is brought up with --no-deps, and its dependencies are
# waited for here: the healthchecks of the compose file run with `podman healthcheck run`
# (without systemd podman runs none by itself), and migrate must exit 0 before the relays
# and the seed start.
up() {
  timeout 300 "${PC[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" up -d --no-deps "$@" \
    >>"/tmp/$PROJECT-up.log" 2>&1 || fail "podman-compose up $*: $(tail -n 30 "/tmp/$PROJECT-up.log")"
}
exit_code() { podman inspect -f '{{.State.ExitCode}} {{.State.Status}}' "$(container "$1")"; }
state() { exit_code "$1" | cut -d' ' -f2; }
t0=$(now_ms)
: >"/tmp/$PROJECT-up.log"
settle_aardvark
up postgres redis receiver
pin_bridge_mac "${PROJECT}_default"
wait_for 15 "the network's DNS answering (aardvark-dns)" resolves "$(container receiver)" postgres
for service in postgres redis; do
  wait_for 60 "$service healthy" podman healthcheck run "$(container "$service")"
done
up migrate
wait_for 60 "migrate finished" is exited state migrate
[ "$(exit_code migrate)" = "0 exited" ] || fail "migrate: $(exit_code migrate)"
up relay-1 relay-2 seed prometheus
wait_for 60 "seed finished" is exited state seed
[ "$(exit_code seed)" = "0 exited" ] || fail "seed: $(exit_code seed)"
rm -f "/tmp/$PROJECT-up.log"
note "up in $(((($(now_ms) - t0) + 500) / 1000))s"
VOLUMES=$(project_volumes)
[ -z "$(container traffic)" ] || fail "the traffic service (profile traffic) was started"
note "migrate and seed exited 0; the traffic profile stayed off"

say "deliveries"
receiver_events() { podman logs "$(container receiver)" 2>/dev/null | grep '^{' || true; }
received() { receiver_events | grep -c '"event": "received"' || true; }
wait_for 60 "5 deliveries at the receiver" at_least 5 received
receiver_events | check_deliveries 5
note "5 signed deliveries (signatures checked by the receiver), order-1001 in order, the flaky row refused with 503 and delivered on a retry, the 410 row refused"
status_ok() {
  local s
  s=$(compose exec -T relay-1 outbox-relay status 2>&1)
  if ! grep -Eq '^FAILED +demo +1$' <<<"$s" || ! grep -Eq '^SUCCESS +demo +5$' <<<"$s" ||
    ! grep -Eq '^SUCCESS +log +1$' <<<"$s"; then
    echo "$s"
    return 1
  fi
}
wait_for 30 "status: FAILED demo 1, SUCCESS demo 5, SUCCESS log 1" status_ok
compose exec -T relay-1 outbox-relay failed 2>/dev/null | grep -q 410 ||
  fail "outbox-relay failed does not show the 410 row"
note "outbox-relay status (exec in relay-1): SUCCESS demo 5, SUCCESS log 1, FAILED demo 1; failed shows the 410"
compose exec -T relay-1 outbox-relay requeue --id 6 --dry-run 2>/dev/null |
  grep -q '^would requeue 1 FAILED row' || fail "requeue --id 6 --dry-run does not offer the 410 row"
compose exec -T relay-1 outbox-relay requeue --id 6 2>/dev/null | grep -q '^requeued 1 FAILED row' ||
  fail "requeue --id 6 did not requeue the 410 row"
refused_410() { receiver_events | grep -c '"status": 410' || true; }
wait_for 30 "the requeued row sent again (and refused again with 410)" is 2 refused_410
note "requeue --id 6 (--dry-run first): the row was sent again and refused again with 410"

say "the lease, the metrics and Prometheus"
lease_held() { curl -sf --max-time 2 "http://127.0.0.1:${PORT[$1]}/metrics" | sed -n 's/^outbox_relay_lease_held //p'; }
one_holder() { [ "$(lease_held relay-1)$(lease_held relay-2)" = 10 ] || [ "$(lease_held relay-1)$(lease_held relay-2)" = 01 ]; }
wait_for 30 "exactly one relay holding the lease" one_holder
if [ "$(lease_held relay-1)" = 1 ]; then holder=relay-1 standby=relay-2; else holder=relay-2 standby=relay-1; fi
note "$holder holds the Redis lease, $standby stands by (lease_held from /metrics on 127.0.0.1)"
prom=http://127.0.0.1:$DEMO_PROMETHEUS_PORT
targets_up() {
  [ "$(curl -sf --max-time 2 "$prom/api/v1/targets" | python3 -c '
import json, sys
print(sum(t["health"] == "up" for t in json.load(sys.stdin)["data"]["activeTargets"]))')" = 2 ]
}
wait_for 60 "Prometheus scraping both relays" targets_up
rules=$(curl -sf --max-time 2 "$prom/api/v1/rules" | python3 -c '
import json, sys
print(sum(len(g["rules"]) for g in json.load(sys.stdin)["data"]["groups"]))')
[ "$rules" -gt 0 ] || fail "Prometheus has no alert rules loaded"
note "Prometheus: both targets up, $rules alert rules loaded"

say "graceful stop of the holder ($holder)"
t0=$(now_ms)
compose stop "$holder" >/dev/null 2>&1
stop_ms=$(($(now_ms) - t0))
[ "$(exit_code "$holder")" = "0 exited" ] || fail "$holder after SIGTERM: $(exit_code "$holder")"
wait_for 15 "$standby holding the lease" is 1 lease_held "$standby"
# The hand-over as the two relays logged it: the holder's release to the standby's acquire.
handover_ms=$(
  {
    podman logs "$(container "$holder")" 2>&1 | grep '"lease released"' | tail -n 1
    podman logs "$(container "$standby")" 2>&1 | grep '"lease acquired"' | tail -n 1
  } | python3 -c '
import json, sys
from datetime import datetime
t = [datetime.fromisoformat(json.loads(l)["timestamp"].replace("Z", "+00:00")) for l in sys.stdin]
if len(t) != 2:
    sys.exit("the release or the acquire is not in the logs")
print(round((t[1] - t[0]).total_seconds() * 1000))'
)
note "$holder exited 0 in $((stop_ms / 1000)).$(printf '%03d' $((stop_ms % 1000)))s; $standby acquired the lease ${handover_ms} ms after $holder released it (their logs)"
before=$(received)
compose exec -T "$standby" outbox-relay enqueue --channel demo \
  --payload '{"type":"after.handover"}' >/dev/null 2>&1
wait_for 30 "a row enqueued after the hand-over delivered" is $((before + 1)) received
note "a row enqueued after the hand-over was delivered by $standby"
compose start "$holder" >/dev/null 2>&1
wait_for 60 "$holder back, standing by" is 0 lease_held "$holder"
note "$holder started again: ready, standing by"
# A crash: SIGKILL, no release. The standby takes over when the key's TTL runs out
# (lease.ttl = 10s in deploy/compose-relay.toml).
t0=$(now_ms)
podman kill -s KILL "$(container "$standby")" >/dev/null
wait_for 20 "$holder taking the lease over after $standby was killed" is 1 lease_held "$holder"
kill_ms=$(($(now_ms) - t0))
note "$standby killed (SIGKILL): $holder held the lease $((kill_ms / 1000)).$(printf '%03d' $((kill_ms % 1000)))s later (lease.ttl 10s)"

say "the traffic profile"
before=$(received)
compose up -d --no-deps traffic >/dev/null 2>&1 || fail "podman-compose --profile traffic up failed"
wait_for 30 "two rows of the traffic service delivered" at_least $((before + 2)) received
t0=$(now_ms)
compose stop traffic >/dev/null 2>&1
stop_ms=$(($(now_ms) - t0))
[ "$(exit_code traffic)" = "0 exited" ] || fail "traffic after SIGTERM: $(exit_code traffic)"
note "a row every 2s delivered; traffic stopped (exit 0) in $((stop_ms / 1000)).$(printf '%03d' $((stop_ms % 1000)))s"

say "podman-compose down -v"
VOLUMES=$(project_volumes)
t0=$(now_ms)
compose down -v >/dev/null 2>&1
note "down in $(((($(now_ms) - t0) + 500) / 1000))s; left by podman-compose: $(leftovers)"
anonymous=0
for v in $VOLUMES; do
  if podman volume exists "$v"; then
    anonymous=$((anonymous + 1))
    podman volume rm -f "$v" >/dev/null
  fi
done
[ "$anonymous" = 0 ] || note "removed $anonymous anonymous volumes (the images' VOLUMEs) that down -v left"
VOLUMES=""
left=$(leftovers)
[ "$left" = "containers 0, pods 0, networks 0, project volumes 0" ] || fail "left after down: $left"
note "nothing left: $left"

say "passed in $(((($(now_ms) - started) + 500) / 1000))s"
