#!/bin/sh
# The part of the official postgres image's entrypoint that the compose demo and
# deploy/verify-image.sh use: on an empty PGDATA, create the cluster with POSTGRES_USER
# (default postgres) and POSTGRES_PASSWORD, password authentication over TCP, and the
# database POSTGRES_DB (default: the user's name); then run the server as postgres.
set -eu
if [ "${1:-postgres}" != postgres ]; then
  exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 0700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set (as with the official image)}"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    # On the socket only, as the official image does, so that no client connects early.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    createdb -U "$user" "$db"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo "stand-in: cluster created for user $user, database $db"
fi
exec postgres -D "$PGDATA"
