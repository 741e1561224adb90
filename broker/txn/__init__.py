"""The transaction coordinator (KIP-98): ``metadata`` (the pure state machine), ``log`` (the format of
``__transaction_state``), ``service`` (the asyncio shell: shards, markers, timeouts)."""
