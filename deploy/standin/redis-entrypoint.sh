#!/bin/sh
# As the official redis image: redis-server runs as the redis user, with protected mode off
# (the official build's default) so that other containers reach it.
set -eu
if [ "${1:-}" = redis-server ]; then
  shift
  exec setpriv --reuid=redis --regid=redis --init-groups redis-server --protected-mode no "$@"
fi
exec "$@"
