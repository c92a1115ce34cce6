#!/usr/bin/env bash
# Makes local stand-ins for the public images that the Dockerfile and docker-compose.yml
# name, on a machine that cannot pull them (no container registry reachable). Each stand-in
# is built from Debian bookworm's packages (debootstrap, then apt inside podman builds) and
# tagged with the public name, so that the Dockerfile and the compose file are built and run
# exactly as written. They are not the real images (other versions of PostgreSQL, Python and
# Prometheus; Debian instead of Alpine): each carries the label org.outbox-relay.standin
# saying what it is, and the verify scripts print it.
#
# An image already present under its name is left alone, whether real or a stand-in: on a
# machine that has pulled the real images, this script changes nothing. It pulls nothing.
#
#   deploy/standin-images.sh            # make the missing ones
#   deploy/standin-images.sh --list     # say which are present, real or stand-in
#   deploy/standin-images.sh --remove   # remove the stand-ins (never a real image)
#
# Needs root (debootstrap, podman), podman and debootstrap: apt-get install podman buildah
# runc debootstrap. Takes about 5 minutes from nothing; nothing is fetched from anywhere but
# Debian's mirror (deb.debian.org) and the local Rust toolchain.
set -euo pipefail
# shellcheck source=deploy/podman/common.sh
source "$(dirname "$0")/podman/common.sh"

DIR=$REPO/deploy/standin
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

standin_label() {
  podman image inspect --format "{{index .Labels \"$STANDIN_LABEL\"}}" "$1" 2>/dev/null || true
}

all_images=("$IMAGE_DEBIAN" "$IMAGE_RUST" "$IMAGE_POSTGRES" "$IMAGE_REDIS" "$IMAGE_PYTHON"
  "$IMAGE_PROMETHEUS")

case "${1:-}" in
  --list)
    for image in "${all_images[@]}"; do
      if ! podman image exists "$image"; then
        echo "absent    $image"
      elif label=$(standin_label "$image") && [ -n "$label" ] && [ "$label" != "<no value>" ]; then
        echo "stand-in  $image ($label)"
      else
        echo "real      $image"
      fi
    done
    exit 0
    ;;
  --remove)
    for image in "${all_images[@]}"; do
      label=$(standin_label "$image")
      if [ -n "$label" ] && [ "$label" != "<no value>" ]; then
        podman rmi "$image" >/dev/null && echo "removed stand-in $image"
      fi
    done
    exit 0
    ;;
  "") ;;
  *)
    echo "usage: $0 [--list | --remove]" >&2
    exit 2
    ;;
esac

need podman "apt-get install podman buildah runc"

# build IMAGE CONTAINERFILE [podman build options...]: a stand-in from one of deploy/standin/.
build() {
  local image=$1 file=$2
  shift 2
  say "stand-in $image ($file)"
  # --network host: apt inside the build reaches the mirror whatever podman's networks are.
  podman build --network host --pull=never -f "$DIR/$file" -t "$image" "$@" "$DIR"
}

made=0

if ! podman image exists "$IMAGE_DEBIAN"; then
  need debootstrap "apt-get install debootstrap"
  [ "$(id -u)" = 0 ] || fail "debootstrap needs root"
  say "stand-in $IMAGE_DEBIAN: debootstrap bookworm (minbase) from $MIRROR"
  work=$(mktemp -d /var/tmp/outbox-relay-standin.XXXXXX)
  trap 'rm -rf "$work"; podman rmi -f localhost/outbox-relay-standin/rootfs:bookworm >/dev/null 2>&1 || true' EXIT
  debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
    fail "debootstrap failed; its log: $(tail -n 20 "$work/debootstrap.log")"
  rm -f "$work"/rootfs/var/cache/apt/archives/*.deb
  tar -C "$work/rootfs" --numeric-owner -cf - . |
    podman import - localhost/outbox-relay-standin/rootfs:bookworm >/dev/null
  rm -rf "$work/rootfs"
  # One layer, as the official image.
  build "$IMAGE_DEBIAN" debian.Containerfile --squash-all \
    --build-arg ROOTFS=localhost/outbox-relay-standin/rootfs:bookworm
  made=$((made + 1))
fi

if ! podman image exists "$IMAGE_RUST"; then
  need rustc "the stand-in for $IMAGE_RUST takes this machine's Rust toolchain"
  have=$(rustc --version | awk '{print $2}')
  case "$have" in
    "$RUST_VERSION" | "$RUST_VERSION".*) ;;
    *) fail "the Dockerfile names Rust $RUST_VERSION but this machine's rustc is $have" ;;
  esac
  sysroot=$(readlink -f "$(rustc --print sysroot)")
  local_ca=()
  if [ -d /usr/local/share/ca-certificates ]; then
    local_ca=(-v /usr/local/share/ca-certificates:/local-ca:ro)
  fi
  build "$IMAGE_RUST" rust.Containerfile "${local_ca[@]}" \
    --build-arg TOOLCHAIN="$have-$(rustc -vV | sed -n 's/^host: //p')" \
    --build-arg RUST_VERSION="$have" \
    -v "$sysroot:/toolchain:ro"
  made=$((made + 1))
fi

for pair in "$IMAGE_POSTGRES postgres" "$IMAGE_REDIS redis" "$IMAGE_PYTHON python" \
  "$IMAGE_PROMETHEUS prometheus"; do
  read -r image name <<<"$pair"
  if ! podman image exists "$image"; then
    build "$image" "$name.Containerfile"
    made=$((made + 1))
  fi
done

say "images ($made made now)"
"$0" --list
