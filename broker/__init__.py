"""copyless broker: the Kafka wire protocol over asyncio/uvloop, an mmap'd segmented commit log, and
zero-copy fetch with os.sendfile."""
