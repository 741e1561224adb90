"""``copyless configs``: every setting of the registry (``broker.config.CONFIGS``), as Kafka's configuration
reference lists them: names, type, default, valid values, whether it changes at run time, what it does.

    copyless configs [WORD] [--topic | --broker] [--json]

``WORD`` keeps the settings whose names contain it. Offline: reads the registry, talks to no broker. With
``--json``, one array of objects ``{"name", "broker_name", "scope", "type", "default", "valid", "dynamic",
"sensitive", "per_listener", "synonyms", "documentation"}`` (a sensitive setting's default is null).
"""

from __future__ import annotations

import json

from copyless.broker.config_def import ConfigKey

__all__ = ["add_parsers", "describe"]


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "configs", help="list every setting: names, defaults, valid values, documentation",
        description="Every broker and topic setting, with Kafka's names. Broker settings go in "
                    "`copyless serve --config FILE` (TOML, names quoted); topic settings in `copyless topics "
                    "create --config` / `alter-config`; dynamic ones change at run time (IncrementalAlterConfigs).")
    parser.add_argument("word", nargs="?", metavar="WORD", help="only the settings whose names contain WORD")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--topic", action="store_true", help="only topic configs")
    scope.add_argument("--broker", action="store_true", help="only broker configs")
    parser.add_argument("--json", action="store_true", help="one JSON array of settings")
    parser.set_defaults(func=run_configs)


def describe(key: ConfigKey) -> dict:
    """One setting as the ``--json`` object."""
    return {
        "name": key.name,
        "broker_name": key.broker_config_name,
        "scope": key.scope.value,
        "type": key.config_type.name,
        "default": None if key.is_sensitive else key.default_text,
        "valid": key.describe_validator() or None,
        "dynamic": key.dynamic,
        "sensitive": key.is_sensitive,
        "per_listener": key.per_listener,
        "synonyms": [synonym.name for synonym in key.synonyms],
        "documentation": key.doc,
    }


def run_configs(args) -> int:
    from copyless.broker.config import CONFIGS

    keys = [key for key in CONFIGS
            if (not args.topic or key.is_topic) and (not args.broker or key.is_broker)
            and (not args.word or any(args.word in name for name in
                                      (key.name, key.broker_config_name or "", *(s.name for s in key.synonyms))))]
    if args.json:
        print(json.dumps([describe(key) for key in keys]))
        return 0
    if not keys:
        print(f"no setting's name contains {args.word!r}")
        return 1
    for number, key in enumerate(keys):
        document = describe(key)
        names = key.name
        if key.broker_config_name not in (None, key.name):
            names += f" (broker: {key.broker_config_name})"
        facts = [document["type"], f"default {document['default'] if document['default'] is not None else 'null'}"]
        if document["valid"]:
            facts.append(f"valid {document['valid']}")
        if key.is_broker:
            facts.append("dynamic" if key.dynamic else "read-only")
        if number:
            print()
        print(f"{names}  [{key.scope.value}]  " + ", ".join(facts))
        print(f"    {key.doc}")
        if key.synonyms:
            print("    also: " + ", ".join(s.name + (f" (x{s.scale:,})" if s.scale != 1 else "") for s in key.synonyms))
        if key.per_listener:
            print(f"    for one listener: listener.name.<listener>.{key.name}")
    return 0
