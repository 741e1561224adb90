"""Sans-IO Kafka protocol pieces shared by the client and the broker: framing and RecordBatch v2."""
