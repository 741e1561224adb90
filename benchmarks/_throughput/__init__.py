"""The parts of ``benchmarks.throughput`` (the campaign and its command line live there):

    brokers     starting, observing and stopping the brokers under test (copyless, Apache Kafka)
    workers     the producer and consumer worker processes, ``Workload`` and ``WorkerResult``
    workloads   running one workload against one broker and turning what the workers measured into figures
    report      the row schema, the side tables, the ratios and the chart
"""
