"""Kafka's murmur2 partitioner: the Java client's published vectors, and agreement with kafka-python."""

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from copyless.protocol.partitioner import murmur2, partition_for_key

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (Apache Kafka): input -> Utils.murmur2 (signed int).
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_the_java_client_vectors():
    for data, expected in JAVA_VECTORS.items():
        assert murmur2(data) == expected, data


def test_partition_is_to_positive_hash_modulo_count():
    # toPositive(-790332482) = -790332482 & 0x7fffffff = 1357151166; 1357151166 % 50 = 16.
    assert partition_for_key(b"foobar", 50) == 16
    assert partition_for_key(b"abc", 1) == 0


@settings(max_examples=200)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_agrees_with_kafka_python(key, count):
    # kafka-python's port returns the unsigned-or-signed value depending on version: compare positive parts.
    assert murmur2(key) & 0x7FFFFFFF == kafka_python_murmur2(key) & 0x7FFFFFFF
    assert partition_for_key(key, count) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % count
