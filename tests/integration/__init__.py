"""Integration tests: real Kafka clients, raw sockets and real broker subprocesses."""
