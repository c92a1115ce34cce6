# shellcheck shell=bash
# shellcheck disable=SC2034 # the image names are used by the scripts that source this file
# Shared by deploy/standin-images.sh, deploy/verify-image.sh and deploy/verify-compose.sh
# (sourced, not run). Bash only.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# podman reads this file instead of the system's containers.conf (see the file for why);
# a CONTAINERS_CONF already set wins.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/deploy/podman/containers.conf}

# The public images the Dockerfile and docker-compose.yml name, fully qualified as Docker
# resolves their short names. The Rust version is read from the Dockerfile so that a bump
# there is followed here.
RUST_VERSION=$(sed -n 's/^ARG RUST_VERSION=//p' "$REPO/Dockerfile")
IMAGE_DEBIAN=docker.io/library/debian:bookworm-slim
IMAGE_RUST=docker.io/library/rust:${RUST_VERSION}-bookworm
IMAGE_POSTGRES=docker.io/library/postgres:16-alpine
IMAGE_REDIS=docker.io/library/redis:7-alpine
IMAGE_PYTHON=docker.io/library/python:3.12-alpine
IMAGE_PROMETHEUS=docker.io/prom/prometheus:v2.53.0
# The label every stand-in carries (deploy/standin-images.sh), so that a report can say
# which images were not the real ones.
STANDIN_LABEL=org.outbox-relay.standin

say() { printf '\n== %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }
fail() {
  printf '\nFAIL: %s\n' "$*" >&2
  exit 1
}

# need COMMAND HINT: stop at once, with the install hint, when a tool is missing.
need() {
  command -v "$1" >/dev/null 2>&1 || fail "$1 is not installed: $2"
}

now_ms() { date +%s%3N; }

# podman_run ARGS...: podman run, without the line "failed to connect to syslog" that podman 4.3
# prints on a machine with no syslog when it starts the DNS server of a network.
podman_run() { podman run "$@" 2> >(grep -v '^failed to connect to syslog' >&2); }

# A TCP port free on 127.0.0.1 at this moment (the kernel picks it), for host ports that must
# not collide with the host's own services.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for SECONDS WHAT COMMAND...: run COMMAND every 0.2s until it succeeds; fail with WHAT
# and what COMMAND said the last time after SECONDS.
wait_for() {
  local seconds=$1 what=$2 out
  shift 2
  local deadline=$(($(now_ms) + seconds * 1000))
  until out=$("$@" 2>&1); do
    if (($(now_ms) > deadline)); then
      fail "$what: not within ${seconds}s${out:+ (last: $out)}"
    fi
    sleep 0.2
  done
}

# is EXPECTED COMMAND...: COMMAND prints EXPECTED (else it says what it printed). For wait_for,
# which runs it anew each time (a "$(...)" in wait_for's arguments would be read once, before
# the first try).
is() {
  local got
  got=$("${@:2}")
  [ "$got" = "$1" ] || {
    echo "$got"
    return 1
  }
}

# at_least N COMMAND...: COMMAND prints a number of at least N.
at_least() {
  local n
  n=$("${@:2}")
  [ "${n:-0}" -ge "$1" ] || {
    echo "$n"
    return 1
  }
}

# pin_bridge_mac NETWORK: give the network's bridge a fixed MAC address. Netavark before 1.9
# (Debian bookworm has 1.4) leaves it to the kernel, which gives a bridge the lowest address of
# its ports and so changes it whenever a container joins or leaves; a container that cached the
# old one cannot reach the gateway, where the network's DNS server listens, until its ARP entry
# is renewed: seen here as a relay failing to resolve `postgres` or `redis` for a minute after
# the one-shot migrate exited (netavark fixed it by setting a static address, its pull request
# 833). Call it once a container is on the network (the bridge exists from then on).
pin_bridge_mac() {
  local dev
  dev=$(podman network inspect -f '{{.NetworkInterface}}' "$1")
  if [ -z "$dev" ] || [ ! -e "/sys/class/net/$dev" ]; then
    fail "no bridge for the network $1"
  fi
  ip link set dev "$dev" address "$(cat "/sys/class/net/$dev/address")" ||
    fail "could not fix the MAC address of $dev (root needed)"
}

# settle_aardvark: wait (at most 10s) for an aardvark-dns with no network left to serve to exit.
# It takes a second or so; netavark 1.4 hands a network created meanwhile to that dying process
# (its pid file still names a live process), and every container on the new network then
# resolves no name at all: seen here when one of these scripts followed another at once. Call
# it before creating a network and after removing one.
settle_aardvark() {
  local dir=/run/containers/networks/aardvark-dns pid
  for _ in $(seq 1 50); do
    pid=$(cat "$dir/aardvark.pid" 2>/dev/null) || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    # Some network is still configured: that aardvark-dns stays.
    [ -z "$(find "$dir" -maxdepth 1 -type f ! -name aardvark.pid -print -quit 2>/dev/null)" ] || return 0
    sleep 0.2
  done
}

# resolves CONTAINER NAME: NAME resolves inside CONTAINER (which must have python).
resolves() { podman exec "$1" python -c "import socket, sys; socket.getaddrinfo(sys.argv[1], 80)" "$2"; }

# check_deliveries N: deploy/demo-receiver.py's JSON lines on stdin show N signed deliveries
# and no bad signature, the three rows of order-1001 in order, the "flaky" row refused once
# with 503 and delivered on a retry, and the "fail" row refused with 410.
check_deliveries() {
  python3 -c '
import json, sys
events = [json.loads(line) for line in sys.stdin]
received = [e for e in events if e["event"] == "received"]
want = int(sys.argv[1])
bad = []
if len(received) != want or not all(e["signed"] for e in received):
    bad.append(f"{len(received)} signed deliveries, not {want}")
if any(e["event"] == "rejected" for e in events):
    bad.append("a delivery had a bad signature")
order = [e["payload"]["type"] for e in received if e["payload"].get("order") == 1001]
if order != ["order.created", "order.paid", "order.shipped"]:
    bad.append(f"order-1001 arrived as {order}")
if not any(e["event"] == "refused" and e["status"] == 503 for e in events):
    bad.append("the flaky row was not refused once")
if not any(e["payload"].get("demo") == "flaky" for e in received):
    bad.append("the flaky row was not delivered on a retry")
if not any(e["event"] == "refused" and e["status"] == 410 for e in events):
    bad.append("the 410 row was not sent")
if bad:
    sys.exit("deliveries: " + "; ".join(bad))
' "$1"
}

# The images this run uses that are stand-ins, one line each (nothing when all are real).
report_standins() {
  local image label
  for image in "$@"; do
    label=$(podman image inspect --format "{{index .Labels \"$STANDIN_LABEL\"}}" "$image" 2>/dev/null || true)
    if [ -n "$label" ] && [ "$label" != "<no value>" ]; then
      note "$image is a stand-in: $label"
    fi
  done
}
