"""The config registry's machinery, after Kafka's ``ConfigDef``: what a setting is (``ConfigKey``), how its
value is read and checked, and the registry (``ConfigDef``) that everything about settings is derived from.

The entries themselves are one table, ``broker.config.CONFIGS``; the TOML loader, topic overrides
(CreateTopics, AlterConfigs, IncrementalAlterConfigs), DescribeConfigs, ``copyless serve --help`` and
``copyless configs`` all read it. A new setting is one ``define`` call there.

A setting has one entry, whatever it is called where:

- its scope: a broker config (``num.partitions``), a topic config (``cleanup.policy``), or both: a topic
  config whose broker config supplies the default (``retention.ms`` <- ``log.retention.ms``);
- its names: ``name`` (the topic config's when it has one), ``broker_name`` when the broker's differs, and
  ``synonyms``, further broker spellings in other units (``log.retention.hours``, 3,600,000 ms each), in
  Kafka's precedence order (the first one a file sets wins);
- its value in three forms: the *text* Kafka's admin APIs carry (``"-1"``, ``"true"``), Kafka's *typed value*
  that validators check (``-1``, ``True``), and the *field value* the broker keeps in its frozen
  ``BrokerConfig`` and ``LogConfig`` (``None`` where Kafka writes -1 for "no limit"). The hot path reads
  only the frozen dataclasses; the registry is read when settings are loaded, changed or described.

Validators are Kafka's where copyless can honour them (``AtLeast``, ``Between``, ``OneOf``, ``ListOf``) and
state a stricter bound's reason in the setting's documentation where it cannot. Messages follow Kafka's:
``Invalid value 10 for configuration segment.bytes: Value must be at least 14``.

Pure: values in, values out; no I/O. Every refusal is a ``ConfigError`` naming the setting.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ConfigError", "ConfigType", "Scope", "Synonym", "ConfigKey", "ConfigDef", "AtLeast", "Between", "OneOf",
    "ListOf", "Supported", "parse_value",
]


class ConfigError(ValueError):
    """A setting is malformed, unknown or refused; the message names it."""


class ConfigType(enum.IntEnum):
    """Kafka's ``ConfigDef.Type``, numbered as DescribeConfigs v3+ carries it (``config_type``)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class Scope(enum.Enum):
    BROKER = "broker"
    TOPIC = "topic"
    BOTH = "topic, broker default"


# Java's integer ranges: Kafka refuses a value its type cannot hold ("Not a number of type INT").
_INTEGER_BITS = {ConfigType.SHORT: 16, ConfigType.INT: 32, ConfigType.LONG: 64}


def _invalid(name: str, value: Any, reason: str | None = None) -> ConfigError:
    shown = value if isinstance(value, str) and value == value.strip() and value else repr(value)
    return ConfigError(f"Invalid value {shown} for configuration {name}" + (f": {reason}" if reason else ""))


def parse_value(config_type: ConfigType, raw: Any, name: str) -> Any:
    """A TOML value or Kafka text -> Kafka's typed value (``int``, ``bool``, ``float``, ``str``, ``tuple``).

    Text is read as Kafka reads a property; a TOML value must have the type's own TOML form or be text.

    Raises:
        ConfigError: the value is not of the type (``Invalid value soon for configuration retention.ms``).
    """
    if config_type == ConfigType.BOOLEAN:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise _invalid(name, raw, "Expected value to be either true or false")
    if config_type in _INTEGER_BITS:
        if isinstance(raw, bool):
            raise _invalid(name, raw, f"Not a number of type {config_type.name}")
        if isinstance(raw, int):
            value = raw
        elif isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                raise _invalid(name, raw, f"Not a number of type {config_type.name}") from None
        else:
            raise _invalid(name, raw, f"Not a number of type {config_type.name}")
        bits = _INTEGER_BITS[config_type]
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise _invalid(name, raw, f"Not a number of type {config_type.name}")
        return value
    if config_type == ConfigType.DOUBLE:
        if isinstance(raw, bool):
            raise _invalid(name, raw, "Not a number of type DOUBLE")
        try:
            return float(raw.strip() if isinstance(raw, str) else raw)
        except (TypeError, ValueError):
            raise _invalid(name, raw, "Not a number of type DOUBLE") from None
    if config_type == ConfigType.LIST:
        items = raw if isinstance(raw, list) else str(raw).split(",") if isinstance(raw, str) else None
        if items is None or not all(isinstance(item, str) for item in items):
            raise _invalid(name, raw, "Expected a comma-separated list")
        return tuple(item.strip() for item in items if item.strip())
    if not isinstance(raw, str):
        raise _invalid(name, raw, "Expected a string")
    return raw


# --- validators: callables (name, typed value) -> None, raising ConfigError; str() is the listing's form ---------


@dataclass(frozen=True)
class AtLeast:
    """Kafka's ``Range.atLeast``; ``also`` admits a few values below (-1: "no limit")."""

    minimum: int | float
    also: tuple[int | float, ...] = ()

    def __call__(self, name: str, value: Any) -> None:
        if value < self.minimum and value not in self.also:
            raise _invalid(name, value, f"Value must be at least {self.minimum}"
                           + "".join(f" (or {other})" for other in self.also))

    def __str__(self) -> str:
        return f"[{self.minimum},...]" + "".join(f" or {other}" for other in self.also)


@dataclass(frozen=True)
class Between:
    """Kafka's ``Range.between`` (both ends included); ``also`` as in ``AtLeast``."""

    minimum: int | float
    maximum: int | float
    also: tuple[int | float, ...] = ()

    def __call__(self, name: str, value: Any) -> None:
        if value in self.also:
            return
        if value < self.minimum:
            raise _invalid(name, value, f"Value must be at least {self.minimum}"
                           + "".join(f" (or {other})" for other in self.also))
        if value > self.maximum:
            raise _invalid(name, value, f"Value must be no more than {self.maximum}")

    def __str__(self) -> str:
        return f"[{self.minimum},...,{self.maximum}]" + "".join(f" or {other}" for other in self.also)


@dataclass(frozen=True)
class OneOf:
    """Kafka's ``ValidString.in``."""

    values: tuple[str, ...]

    def __call__(self, name: str, value: Any) -> None:
        if value not in self.values:
            raise _invalid(name, value, f"String must be one of: {', '.join(self.values)}")

    def __str__(self) -> str:
        return f"[{', '.join(self.values)}]"


@dataclass(frozen=True)
class ListOf:
    """Kafka's ``ValidList.in``: every item one of ``values``."""

    values: tuple[str, ...]

    def __call__(self, name: str, value: Any) -> None:
        for item in value:
            if item not in self.values:
                raise _invalid(name, ",".join(value), f"Invalid value {item}: must be one of {', '.join(self.values)}")

    def __str__(self) -> str:
        return f"[{', '.join(self.values)}]"


@dataclass(frozen=True)
class Supported:
    """Values Kafka knows but copyless does not do yet: only ``values`` are accepted, and the refusal says so
    (``cleanup.policy=compact is not supported (supported: delete)``). Lists are checked item by item."""

    values: tuple[Any, ...]

    def __call__(self, name: str, value: Any) -> None:
        items = value if isinstance(value, tuple) else (value,)
        if any(item not in self.values for item in items):
            supported = ", ".join(map(_text, self.values))
            raise ConfigError(f"{name}={_text(value)} is not supported (supported: {supported})")

    def __str__(self) -> str:
        return f"[{', '.join(map(_text, self.values))}]"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


# --- keys ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synonym:
    """Another broker spelling of a setting: its value times ``scale`` is the setting's (hours -> ms)."""

    name: str
    scale: int = 1
    config_type: ConfigType | None = None  # its own type when it differs (log.retention.hours is an INT)


NO_DEFAULT = object()


@dataclass(frozen=True, eq=False)
class ConfigKey:
    """One setting. See the module docstring for its names and value forms.

    ``parse``: a setting whose value is not one of Kafka's plain types (``listeners``, ``HOST:PORT``): raw
    TOML value or text -> field value, raising ValueError. ``apply``: the further BrokerConfig fields a value
    sets (``listen`` sets host and port). ``text``: field value -> Kafka text, for those. ``read``: the value
    to describe, from a BrokerConfig, where it is not simply the field's (a field left at None for the mode's
    default, single node or cluster; a setting made of two fields; the security settings). ``per_listener``:
    Kafka's ``listener.name.<listener>.<name>`` may also set it for one listener.
    """

    name: str
    config_type: ConfigType
    doc: str
    scope: Scope = Scope.BROKER
    default: Any = NO_DEFAULT
    validator: Callable[[str, Any], None] | None = None
    dynamic: bool = False
    broker_name: str | None = None
    synonyms: tuple[Synonym, ...] = ()
    field: str | None = None
    log_field: str | None = None
    unlimited: bool = False
    sensitive: bool = False
    parse: Callable[[Any], Any] | None = None
    apply: Callable[[Any], dict[str, Any]] | None = None
    text: Callable[[Any], str | None] | None = None
    read: Callable[[Any], Any] | None = None
    per_listener: bool = False

    # --- names ---

    @property
    def is_broker(self) -> bool:
        return self.scope is not Scope.TOPIC

    @property
    def is_topic(self) -> bool:
        return self.scope is not Scope.BROKER

    @property
    def broker_config_name(self) -> str | None:
        """The broker config's name (None: a topic config only)."""
        return (self.broker_name or self.name) if self.is_broker else None

    @property
    def is_sensitive(self) -> bool:
        return self.sensitive or self.config_type == ConfigType.PASSWORD

    def _synonym(self, name: str) -> Synonym | None:
        return next((synonym for synonym in self.synonyms if synonym.name == name), None)

    # --- values ---

    def value_of(self, raw: Any, name: str | None = None) -> Any:
        """A TOML value or Kafka text, given under ``name`` (the key's name or a synonym) -> the field value.

        Raises:
            ConfigError: not of the type, or refused by the validator (named as given).
        """
        shown = name or self.name
        if self.parse is not None:
            try:
                return self.parse(raw)
            except ConfigError as exc:
                raise ConfigError(f"Invalid value {raw!r} for configuration {shown}: {exc}") from None
            except (TypeError, ValueError) as exc:
                raise _invalid(shown, raw, str(exc) or None) from None
        synonym = self._synonym(shown) if name is not None else None
        value = parse_value(synonym.config_type or self.config_type if synonym else self.config_type, raw, shown)
        if synonym is not None and synonym.scale != 1:
            # Kafka reads a negative value in another unit as "no limit", not as that many units.
            value = -1 if self.unlimited and value < 0 else value * synonym.scale
        if self.validator is not None:
            self.validator(shown, value)
        return self.field_value(value)

    def field_value(self, value: Any) -> Any:
        """Kafka's typed value -> the field's (a negative "no limit" is None)."""
        return None if self.unlimited and value is not None and value < 0 else value

    def kafka_value(self, field_value: Any) -> Any:
        return -1 if self.unlimited and field_value is None else field_value

    def check_field(self, field_value: Any, name: str | None = None) -> None:
        """Run the validator on a field value (a BrokerConfig made in code). Raises ConfigError."""
        if self.validator is not None and self.parse is None and field_value is not None:
            self.validator(name or self.broker_config_name or self.name, self.kafka_value(field_value))

    def text_of(self, field_value: Any) -> str | None:
        """A field value as Kafka's admin APIs write it (None: null)."""
        if self.text is not None:
            return self.text(field_value)
        value = self.kafka_value(field_value)
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (tuple, list)):
            return ",".join(str(item) for item in value)
        return str(value)

    def fields(self, field_value: Any) -> dict[str, Any]:
        """The BrokerConfig fields this value sets."""
        changes = {self.field: field_value} if self.field else {}
        if self.apply is not None:
            changes.update(self.apply(field_value))
        return changes

    @property
    def default_text(self) -> str | None:
        return self.text_of(self.default)

    def current(self, config: Any) -> Any:
        """This setting's value in ``config`` (a BrokerConfig), as its field holds it."""
        if self.read is not None:
            return self.read(config)
        return getattr(config, self.field) if self.field else self.default

    def describe_validator(self) -> str:
        return "" if self.validator is None else str(self.validator)


class ConfigDef:
    """The registry: every setting by its names. ``defaults``: the object whose fields give the defaults of
    settings defined with a ``field`` and no ``default`` (the broker's: ``BrokerConfig()``)."""

    def __init__(self, defaults: Any = None) -> None:
        self._defaults = defaults
        self._keys: list[ConfigKey] = []
        self._broker_names: dict[str, tuple[ConfigKey, Synonym | None]] = {}
        self._topic_names: dict[str, ConfigKey] = {}

    def define(self, name: str, config_type: ConfigType, doc: str, **options: Any) -> ConfigDef:
        """Add a setting (options: the ``ConfigKey`` fields). Returns the registry, so definitions chain.

        Raises:
            ValueError: a name taken twice, or a default that its own validator refuses (a bug in the table).
        """
        if options.get("default", NO_DEFAULT) is NO_DEFAULT:
            if options.get("field") is None or self._defaults is None:
                raise ValueError(f"{name}: a default, or a field of the defaults object, is required")
            options["default"] = getattr(self._defaults, options["field"])
        return self.add(ConfigKey(name, config_type, doc, **options))

    def add(self, key: ConfigKey) -> ConfigDef:
        """Add a setting defined elsewhere (an area's own list of keys, as Kafka's SslConfigs). Raises
        ValueError as ``define``."""
        if key.default is NO_DEFAULT:
            raise ValueError(f"{key.name}: a default is required")
        name = key.name
        names: list[tuple[str, str]] = []
        if key.is_topic:
            names.append(("topic", name))
        if key.is_broker:
            names.append(("broker", key.broker_name or key.name))  # its broker_config_name
            names.extend(("broker", synonym.name) for synonym in key.synonyms)
        for kind, taken in names:
            table = self._topic_names if kind == "topic" else self._broker_names
            if taken in table:
                raise ValueError(f"{kind} config {taken} defined twice")
        for kind, taken in names:
            if kind == "topic":
                self._topic_names[taken] = key
            else:
                self._broker_names[taken] = (key, key._synonym(taken))
        key.check_field(key.default)
        self._keys.append(key)
        return self

    def __iter__(self) -> Iterator[ConfigKey]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def broker_keys(self) -> list[ConfigKey]:
        return [key for key in self._keys if key.is_broker]

    def topic_keys(self) -> list[ConfigKey]:
        return [key for key in self._keys if key.is_topic]

    def broker_key(self, name: str) -> ConfigKey | None:
        """The setting a broker config name (or synonym) names."""
        found = self._broker_names.get(name)
        return found[0] if found else None

    def topic_key(self, name: str) -> ConfigKey | None:
        return self._topic_names.get(name)

    def __getitem__(self, name: str) -> ConfigKey:
        """By topic or broker name. Raises KeyError."""
        key = self._topic_names.get(name) or self.broker_key(name)
        if key is None:
            raise KeyError(name)
        return key

    def precedence(self, name: str) -> int:
        """0 for a setting's own broker name, then its synonyms in order: the lower wins when a file sets two."""
        key, synonym = self._broker_names[name]
        return 0 if synonym is None else 1 + key.synonyms.index(synonym)

    def close_matches(self, name: str, *, topic: bool = False) -> list[str]:
        """Known names that look like ``name`` (a typo's likely meaning)."""
        names = self._topic_names if topic else self._broker_names
        return difflib.get_close_matches(name, list(names), n=3, cutoff=0.8)

    def unknown(self, name: str, where: str, *, topic: bool = False) -> ConfigError:
        """The refusal of an unknown name, with the likely meant one."""
        matches = self.close_matches(name, topic=topic)
        hint = f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""
        return ConfigError(f"unknown setting {name!r} in {where}{hint}")
