#!/bin/sh
# kafka-acls.sh as librdkafka's tests call it (0109, 0115, 0119): `copyless acls` takes the same options.
exec python3 -c 'import sys; from copyless.broker import cli; sys.exit(cli.main(["acls", *sys.argv[1:]]))' "$@"
