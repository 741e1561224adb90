#!/bin/sh
# kafka-topics.sh as librdkafka's tests call it (KAFKA_PATH/bin), carried out by copyless's own CLI.
exec python3 -m tests.librdkafka.kafka_topics "$@"
