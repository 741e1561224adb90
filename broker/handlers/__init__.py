"""The request-handler table: one module per API area, merged into ``{api_key: (min, max, handler)}``.

Each handler module exposes ``HANDLERS = {api_key: (min_version, max_version, handler)}`` and, optionally,
lifecycle hooks ``async def startup(broker)`` (after the logs are loaded, before the listener accepts) and
``async def shutdown(broker)`` (after the last request, before the logs are closed). The table drives both
dispatch and the ApiVersions response, so an API is advertised exactly when it is served.

Adding an area is one line in ``_MODULES``; ``groups`` (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups) is picked up when its module exists.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from copyless.broker.handlers.context import CloseConnection, EncodedResponse, RequestContext

__all__ = ["HandlerTable", "load_handlers", "RequestContext", "EncodedResponse", "CloseConnection"]

log = logging.getLogger("copyless.handlers")

Handler = Callable[[RequestContext, Any], Awaitable[Any]]

# (module, required). Optional modules are skipped when absent, so the broker runs before they land.
_MODULES = (
    ("copyless.broker.handlers.api_versions", True),
    ("copyless.broker.handlers.metadata", True),
    ("copyless.broker.handlers.produce", True),
    ("copyless.broker.handlers.fetch", True),
    ("copyless.broker.handlers.list_offsets", True),
    ("copyless.broker.handlers.topics", True),
    ("copyless.broker.handlers.producer_ids", True),
    ("copyless.broker.handlers.leader_epoch", True),
    ("copyless.broker.handlers.configs", True),
    ("copyless.broker.handlers.cluster", True),
    ("copyless.broker.handlers.delete_records", True),
    ("copyless.broker.handlers.sasl", True),
    ("copyless.broker.handlers.acls", True),
    ("copyless.broker.handlers.scram", True),
    ("copyless.broker.handlers.groups", False),
    ("copyless.broker.handlers.transactions", True),
)


@dataclass
class HandlerTable:
    entries: dict[int, tuple[int, int, Handler]] = field(default_factory=dict)
    startup_hooks: list[Callable] = field(default_factory=list)
    shutdown_hooks: list[Callable] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    _served: dict[int, tuple[int, int]] | None = field(default=None, repr=False)

    def register(self, module_name: str, handlers: dict) -> None:
        for api_key, (low, high, handler) in handlers.items():
            if api_key in self.entries:
                raise ValueError(f"API key {api_key} is registered twice ({module_name})")
            if not 0 <= low <= high:
                raise ValueError(f"bad version range {low}-{high} for API key {api_key} in {module_name}")
            self.entries[api_key] = (int(low), int(high), handler)
        self._served = None

    def served(self) -> dict[int, tuple[int, int]]:
        """api_key -> (min, max): what ApiVersions advertises and what dispatch accepts (cached: every
        request consults it)."""
        if self._served is None:
            self._served = {key: (low, high) for key, (low, high, _h) in self.entries.items()}
        return self._served

    def handler(self, api_key: int) -> Handler | None:
        entry = self.entries.get(api_key)
        return entry[2] if entry else None


def load_handlers(module_names: tuple[tuple[str, bool], ...] = _MODULES) -> HandlerTable:
    table = HandlerTable()
    for name, required in module_names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not required and exc.name == name:
                log.info("handler module %s not present; its APIs are not served", name)
                continue
            raise
        table.register(name, module.HANDLERS)
        table.modules.append(name)
        if hasattr(module, "startup"):
            table.startup_hooks.append(module.startup)
        if hasattr(module, "shutdown"):
            table.shutdown_hooks.append(module.shutdown)
    return table
