#!/bin/sh
# As the official image's entrypoint does: a redis-server without a password answers other
# containers (compose's network) only with protected mode off. Compose publishes the port
# on 127.0.0.1 alone.
if [ "$1" = "redis-server" ]; then
    set -- "$@" --protected-mode no
fi
exec "$@"
