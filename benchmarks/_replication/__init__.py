"""The parts of ``benchmarks.replication`` and ``benchmarks.cluster_metadata``: ``clusters`` (etcd, a
copyless cluster, the reference Kafka cluster: started, killed, restarted and stopped by pid), ``failover``
(a steady acks=all stream and the stall a SIGKILL of its leader causes), ``timeline`` (the pure arithmetic
of stalls and latencies over acknowledgement times)."""
