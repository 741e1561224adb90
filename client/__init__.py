"""copyless client: an asyncio Kafka producer, consumer and admin client, and the kcat-like CLI."""
