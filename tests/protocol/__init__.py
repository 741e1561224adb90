"""The pure protocol core: frame reassembly and RecordBatch v2, against kafka-python's implementation."""
