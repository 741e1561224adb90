"""``copyless users`` and ``copyless acls``: SCRAM credentials and ACLs, over ``Admin``.

    copyless users list
    copyless users set NAME [--mechanism SCRAM-SHA-512] [--iterations 4096] [--password-file FILE]
    copyless users delete NAME [--mechanism SCRAM-SHA-512]

``users set`` reads the password from ``--password-file``, else from the terminal (twice), else one line
of stdin; it never takes it as an argument. The salted password is computed here and only it is sent.

``copyless acls`` takes kafka-acls.sh's options, so scripts written for it run unchanged (a
``kafka-acls.sh`` that execs ``copyless acls "$@"`` serves librdkafka's test suite)::

    copyless acls --add --allow-principal User:alice --operation Read --operation Describe --topic orders
    copyless acls --add --deny-principal 'User:*' --operation All --deny-host '*' --topic secret
    copyless acls --add --allow-principal User:bob --operation Write --topic pay- --resource-pattern-type prefixed
    copyless acls --list [--topic orders] [--principal User:alice]
    copyless acls --remove --force --allow-principal User:alice --operation Read --topic orders

``--add`` stores one binding per resource, principal, host and operation. ``--remove`` deletes the bindings
those options select (no principal or operation: every binding of the resource); without ``--force`` it
asks on a terminal and refuses otherwise. ``--bootstrap-server`` and ``--command-config`` are kafka-acls.sh's
names for ``-b`` and ``-F``.
"""

from __future__ import annotations

import getpass
import json
import sys

from copyless.client.cli_common import add_common, client_security, run

__all__ = ["add_parsers"]

_OPERATIONS = ("All", "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs",
               "AlterConfigs", "IdempotentWrite")


def add_parsers(subparsers) -> None:
    users = subparsers.add_parser("users", help="list, set and delete SCRAM credentials")
    actions = users.add_subparsers(dest="users_command", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="users with SCRAM credentials, their mechanisms and iterations")
    add_common(listing)
    setting = actions.add_parser("set", help="create or replace a user's SCRAM credential")
    setting.add_argument("name", help="the user name")
    add_common(setting)
    setting.add_argument("--mechanism", default="SCRAM-SHA-512", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"),
                         help="the SCRAM mechanism of the credential (default SCRAM-SHA-512)")
    setting.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations, 4096..16384 (default 4096)")
    setting.add_argument("--password-file", metavar="FILE", help="read the password from FILE (its first line)")
    deleting = actions.add_parser("delete", help="delete a user's SCRAM credential")
    deleting.add_argument("name", help="the user name")
    add_common(deleting)
    deleting.add_argument("--mechanism", default="SCRAM-SHA-512", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"),
                          help="the SCRAM mechanism of the credential (default SCRAM-SHA-512)")
    for parser in (listing, setting, deleting):
        parser.set_defaults(func=_run_users, command_name=f"copyless users {parser.prog.split()[-1]}")

    acls = subparsers.add_parser("acls", help="add, list and remove ACLs (kafka-acls.sh's options)")
    add_common(acls)
    acls.add_argument("--bootstrap-server", dest="bootstrap", metavar="HOST:PORT[,...]", help="same as -b")
    acls.add_argument("--command-config", dest="properties", metavar="FILE", help="same as -F")
    mode = acls.add_mutually_exclusive_group(required=True)
    mode.add_argument("--add", action="store_const", dest="mode", const="add", help="add ACLs")
    mode.add_argument("--remove", action="store_const", dest="mode", const="remove", help="remove ACLs")
    mode.add_argument("--list", action="store_const", dest="mode", const="list", help="list ACLs")
    acls.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL",
                      help="an ALLOW binding for this principal, e.g. User:alice (repeatable)")
    acls.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL",
                      help="a DENY binding for this principal (repeatable)")
    acls.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                      help="the host the ALLOW bindings apply from (default *; repeatable)")
    acls.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                      help="the host the DENY bindings apply from (default *; repeatable)")
    acls.add_argument("--principal", action="append", default=[], metavar="PRINCIPAL", help="--list: only these")
    acls.add_argument("--operation", action="append", default=[], metavar="OPERATION",
                      help=f"one of {', '.join(_OPERATIONS)} (repeatable; --add defaults to All)")
    acls.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                      help="a topic resource (repeatable; * for every topic)")
    acls.add_argument("--group", action="append", default=[], metavar="GROUP",
                      help="a consumer group resource (repeatable; * for every group)")
    acls.add_argument("--transactional-id", action="append", default=[], metavar="ID",
                      help="a transactional id resource (repeatable)")
    acls.add_argument("--cluster", action="store_true", help="the cluster resource")
    acls.add_argument("--resource-pattern-type", default=None, metavar="TYPE",
                      help="literal or prefixed (--add, default literal); any or match too for --list/--remove")
    acls.add_argument("--force", action="store_true", help="--remove without asking")
    acls.set_defaults(func=_run_acls, command_name="copyless acls")


# --- users --------------------------------------------------------------------------------------------------


def _read_password(args) -> str:
    if args.password_file:
        with open(args.password_file) as handle:
            password = handle.readline().rstrip("\n")
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise ValueError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise ValueError("the password is empty")
    return password


def _run_users(args) -> int:
    return run(args, _users(args))


async def _users(args) -> int:
    from copyless.client.admin import Admin

    password = _read_password(args) if args.users_command == "set" else None
    async with Admin(args.bootstrap, client_id="copyless-cli", security=client_security(args)) as admin:
        if args.users_command == "list":
            users = await admin.describe_scram_credentials()
            if args.json:
                print(json.dumps({"users": users}))
                return 0
            rows = [["USER", "MECHANISM", "ITERATIONS"]]
            rows += [[user, mechanism, str(iterations)] for user, mechanisms in sorted(users.items())
                     for mechanism, iterations in sorted(mechanisms.items())]
            print(_table(rows))
        elif args.users_command == "set":
            assert password is not None  # read above for "set"
            await admin.set_scram_credential(args.name, password, mechanism=args.mechanism, iterations=args.iterations)
            _done(args, {"user": args.name, "mechanism": args.mechanism, "iterations": args.iterations, "set": True},
                  f"{args.mechanism} credential of {args.name} set ({args.iterations} iterations)")
        else:
            await admin.delete_scram_credential(args.name, mechanism=args.mechanism)
            _done(args, {"user": args.name, "mechanism": args.mechanism, "deleted": True},
                  f"{args.mechanism} credential of {args.name} deleted")
    return 0


def _done(args, document: dict, text: str) -> None:
    print(json.dumps(document) if args.json else text)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


# --- acls ---------------------------------------------------------------------------------------------------


def _operation(name: str) -> str:
    """kafka-acls.sh's CamelCase (Read, ClusterAction) or upper case -> the wire name (READ, CLUSTER_ACTION)."""
    text = name.strip()
    for known in _OPERATIONS:
        if text.lower() == known.lower() or text.upper() == _snake(known):
            return _snake(known)
    raise ValueError(f"unknown operation {name!r} (one of {', '.join(_OPERATIONS)})")


def _snake(camel: str) -> str:
    out = []
    for index, char in enumerate(camel):
        if char.isupper() and index:
            out.append("_")
        out.append(char.upper())
    return "".join(out)


def _resources(args) -> list[tuple[str, str | None]]:
    resources: list[tuple[str, str | None]] = [("TOPIC", t) for t in args.topic] + [("GROUP", g) for g in args.group]
    resources += [("TRANSACTIONAL_ID", t) for t in args.transactional_id]
    if args.cluster:
        resources.append(("CLUSTER", "kafka-cluster"))
    return resources


def _entries(args) -> list[tuple[str, str | None, str | None]]:
    """(permission, principal, host) for every principal and host given."""
    entries: list[tuple[str, str | None, str | None]] = []
    for permission, principals, hosts in (("ALLOW", args.allow_principal, args.allow_host),
                                          ("DENY", args.deny_principal, args.deny_host)):
        for principal in principals:
            for host in hosts or ["*"]:
                entries.append((permission, principal, host))
    return entries


def _run_acls(args) -> int:
    return run(args, _acls(args))


async def _acls(args) -> int:
    from copyless.client.admin import Admin
    from copyless.client.admin_security import Acl

    resources = _resources(args)
    operations = [_operation(op) for op in args.operation]
    pattern = (args.resource_pattern_type or ("LITERAL" if args.mode == "add" else
                                              "LITERAL" if resources else "ANY")).upper()
    async with Admin(args.bootstrap, client_id="copyless-cli", security=client_security(args)) as admin:
        if args.mode == "add":
            if not resources:
                raise ValueError("--add needs a resource: --topic, --group, --transactional-id or --cluster")
            entries = _entries(args)
            if not entries:
                raise ValueError("--add needs --allow-principal or --deny-principal")
            bindings = [Acl(rtype, name, pattern, principal, host, op, permission)
                        for rtype, name in resources for permission, principal, host in entries
                        for op in operations or ["ALL"]]
            await admin.create_acls(bindings)
            _print_acls(args, bindings, "added")
            return 0
        if args.mode == "list":
            principals = args.principal or [None]
            found = []
            for rtype, name in resources or [("ANY", None)]:
                for principal in principals:
                    found += await admin.describe_acls(Acl(rtype, name, pattern if resources else "ANY", principal))
            _print_acls(args, found, "current")
            return 0
        # --remove
        if not resources:
            raise ValueError("--remove needs a resource: --topic, --group, --transactional-id or --cluster")
        entries = _entries(args) or [("ANY", None, None)]
        filters = [Acl(rtype, name, pattern, principal, host, op, permission)
                   for rtype, name in resources for permission, principal, host in entries
                   for op in operations or ["ANY"]]
        if not args.force:
            if not sys.stdin.isatty():
                raise ValueError("--remove without --force asks for confirmation: add --force when not at a terminal")
            answer = input(f"remove the ACLs matching {len(filters)} filter(s) on "
                           f"{', '.join(f'{t}:{n}' for t, n in resources)}? (y/n) ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing removed")
                return 0
        removed = await admin.delete_acls(filters)
        _print_acls(args, removed, "removed")
    return 0


def _print_acls(args, acls, verb: str) -> None:
    if args.json:
        print(json.dumps({verb: [acl.__dict__ for acl in acls]}))
        return
    if not acls:
        print(f"no ACLs {verb}" if verb != "current" else "no ACLs")
        return
    by_resource: dict[tuple, list] = {}
    for acl in acls:
        by_resource.setdefault((acl.resource_type, acl.pattern_type, acl.resource_name), []).append(acl)
    for (rtype, pattern, name), items in by_resource.items():
        print(f"{verb.capitalize()} ACLs for resource `ResourcePattern(resourceType={rtype}, name={name}, "
              f"patternType={pattern})`:")
        for acl in items:
            print(f"  (principal={acl.principal}, host={acl.host}, operation={acl.operation}, "
                  f"permissionType={acl.permission})")
