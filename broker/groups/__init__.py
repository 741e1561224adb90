"""Consumer groups: the classic group protocol and committed offsets stored in ``__consumer_offsets``.

- ``coordinator``: the pure group state machine (Kafka's GroupCoordinator/GroupMetadata), time injected;
- ``offsets``: the ``__consumer_offsets`` record format and the view rebuilt from it (pure);
- ``service``: the asyncio shell (timers, parked requests, appends, startup replay, offset expiry);
- ``cli``: ``copyless groups list|describe`` over the Kafka protocol.

The request handlers are in ``broker.handlers.groups``.
"""
