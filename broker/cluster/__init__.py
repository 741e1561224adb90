"""Cluster metadata: who the brokers are, which topics exist, where each partition's replicas live, who leads.

Two backends behind one interface (``backend.MetadataBackend``): ``embedded`` (a single node, its
``topics.json``, no coordination service) and ``etcd`` (several brokers coordinated through etcd, in the role
ZooKeeper played for Kafka). Both publish the same immutable ``ClusterImage``; the broker's replica manager
applies each image to the partitions this node hosts.
"""
