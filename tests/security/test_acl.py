"""The authorizer: Kafka's examples, and properties over random binding sets (DENY wins, ALLOW is monotonic,
super users pass, the MATCH filter selects exactly the bindings a decision looks at)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclError,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def b(rtype, name, pattern, principal, op, perm=ALLOW, host="*"):
    return AclBinding(rtype, name, pattern, principal, host, op, perm).check()


def test_no_acls_denies_unless_allow_everyone():
    assert not Authorizer().authorize("User:alice", "10.0.0.1", Operation.READ, T, "orders")
    assert Authorizer(allow_if_no_acls=True).authorize("User:alice", "10.0.0.1", Operation.READ, T, "orders")


def test_literal_prefixed_and_wildcard():
    authorizer = Authorizer([
        b(T, "orders", LIT, "User:alice", Operation.READ),
        b(T, "pay-", PRE, "User:bob", Operation.WRITE),
        b(T, "*", LIT, "User:carol", Operation.DESCRIBE),
    ])
    assert authorizer.authorize("User:alice", "h", Operation.READ, T, "orders")
    assert not authorizer.authorize("User:alice", "h", Operation.READ, T, "orders2")
    assert authorizer.authorize("User:bob", "h", Operation.WRITE, T, "pay-eu")
    assert not authorizer.authorize("User:bob", "h", Operation.WRITE, T, "pa")
    assert authorizer.authorize("User:carol", "h", Operation.DESCRIBE, T, "anything")
    assert not authorizer.authorize("User:carol", "h", Operation.READ, T, "anything")


def test_deny_wins_whatever_the_pattern():
    authorizer = Authorizer([
        b(T, "*", LIT, "User:*", Operation.ALL),
        b(T, "secret-", PRE, "User:alice", Operation.READ, DENY),
    ])
    assert authorizer.authorize("User:alice", "h", Operation.READ, T, "public")
    assert not authorizer.authorize("User:alice", "h", Operation.READ, T, "secret-x")
    # A DENY on Read implies nothing: Describe stays allowed (Kafka's rule).
    assert authorizer.authorize("User:alice", "h", Operation.DESCRIBE, T, "secret-x")
    assert authorizer.authorize("User:bob", "h", Operation.READ, T, "secret-x")


def test_implied_describe_and_describe_configs():
    authorizer = Authorizer([b(T, "t", LIT, "User:a", op) for op in (Operation.WRITE,)] +
                            [b(T, "u", LIT, "User:a", Operation.ALTER_CONFIGS)])
    assert authorizer.authorize("User:a", "h", Operation.DESCRIBE, T, "t")
    assert not authorizer.authorize("User:a", "h", Operation.READ, T, "t")
    assert authorizer.authorize("User:a", "h", Operation.DESCRIBE_CONFIGS, T, "u")
    assert not authorizer.authorize("User:a", "h", Operation.DESCRIBE, T, "u")


def test_host_and_super_users():
    authorizer = Authorizer([b(G, "g", LIT, "User:a", Operation.READ, host="10.0.0.1")], super_users=["User:admin"])
    assert authorizer.authorize("User:a", "10.0.0.1", Operation.READ, G, "g")
    assert not authorizer.authorize("User:a", "10.0.0.2", Operation.READ, G, "g")
    assert authorizer.authorize("User:admin", "10.0.0.2", Operation.DELETE, G, "g")
    assert authorizer.authorize("User:admin", "any", Operation.CLUSTER_ACTION, C, CLUSTER_NAME)


def test_allow_everyone_applies_per_resource():
    """An ACL on one topic takes that topic out of allow.everyone.if.no.acl.found, not the others."""
    authorizer = Authorizer([b(T, "t", LIT, "User:a", Operation.READ)], allow_if_no_acls=True)
    assert not authorizer.authorize("User:b", "h", Operation.READ, T, "t")
    assert authorizer.authorize("User:b", "h", Operation.READ, T, "other")


def test_authorize_any_for_idempotent_producers():
    authorizer = Authorizer([b(T, "t", LIT, "User:a", Operation.WRITE)])
    assert authorizer.authorize_any("User:a", "h", Operation.WRITE, T)
    assert not authorizer.authorize_any("User:b", "h", Operation.WRITE, T)
    denied = Authorizer([b(T, "t", LIT, "User:a", Operation.WRITE), b(T, "*", LIT, "User:a", Operation.WRITE, DENY)])
    assert not denied.authorize_any("User:a", "h", Operation.WRITE, T)
    prefix_denied = Authorizer([b(T, "ab", PRE, "User:a", Operation.WRITE),
                                b(T, "a", PRE, "User:*", Operation.ALL, DENY)])
    assert not prefix_denied.authorize_any("User:a", "h", Operation.WRITE, T)


@pytest.mark.parametrize("bad", [
    dict(resource_type=ResourceType.ANY), dict(pattern_type=PatternType.MATCH), dict(operation=Operation.ANY),
    dict(permission=Permission.ANY), dict(principal="alice"), dict(resource_name=""), dict(host=""),
    dict(resource_type=C, resource_name="other-cluster"), dict(operation=Operation.CLUSTER_ACTION),
    dict(pattern_type=PRE, resource_name="*"),
])
def test_bindings_kafka_refuses(bad):
    fields = dict(resource_type=T, resource_name="t", pattern_type=LIT, principal="User:a", host="*",
                  operation=Operation.READ, permission=ALLOW)
    fields.update(bad)
    with pytest.raises(AclError):
        AclBinding(**fields).check()


def test_json_round_trip_and_refusal():
    binding = b(T, "pay-", PRE, "User:bob", Operation.WRITE, DENY, host="10.1.1.1")
    assert AclBinding.from_json(binding.to_json()) == binding
    with pytest.raises(AclError):
        AclBinding.from_json({"resource_type": "TOPIC"})


def test_filters():
    bindings = [b(T, "orders", LIT, "User:a", Operation.READ), b(T, "ord", PRE, "User:b", Operation.WRITE),
                b(T, "*", LIT, "User:c", Operation.READ), b(G, "orders", LIT, "User:a", Operation.READ)]
    authorizer = Authorizer(bindings)
    assert authorizer.matching(AclBindingFilter()) == sorted(bindings, key=lambda x: (x.resource_type, x.resource_name,
                                                                                      x.pattern_type, x.principal))
    match = authorizer.matching(AclBindingFilter(T, "orders", PatternType.MATCH))
    assert set(match) == set(bindings[:3])
    assert authorizer.matching(AclBindingFilter(T, "orders", PatternType.ANY)) == [bindings[0]]
    assert authorizer.matching(AclBindingFilter(principal="User:b")) == [bindings[1]]
    assert authorizer.matching(AclBindingFilter(T, "ord", PRE)) == [bindings[1]]


# --- properties ---------------------------------------------------------------------------------------------

NAMES = ["a", "ab", "abc", "b", "*"]
PRINCIPALS = ["User:x", "User:y", "User:*"]
HOSTS = ["h1", "h2", "*"]
OPS = [Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.ALL, Operation.DELETE, Operation.ALTER]

bindings_st = st.builds(
    AclBinding, st.sampled_from([T, G]), st.sampled_from(NAMES), st.sampled_from([LIT, PRE]),
    st.sampled_from(PRINCIPALS), st.sampled_from(HOSTS), st.sampled_from(OPS), st.sampled_from([ALLOW, DENY]),
).filter(lambda x: not (x.pattern_type == PRE and x.resource_name == "*"))
request_st = st.tuples(st.sampled_from(["User:x", "User:y"]), st.sampled_from(["h1", "h2"]),
                       st.sampled_from([Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.DELETE]),
                       st.sampled_from([T, G]), st.sampled_from(["a", "ab", "abc", "b", "c"]))


def _reference(bindings, principal, host, op, rtype, name, allow_if_no_acls=False):
    """Kafka's documented rules, written as a plain scan (no index)."""
    def applies(x):
        if x.resource_type != rtype:
            return False
        if x.pattern_type == LIT:
            return x.resource_name in (name, "*")
        return name.startswith(x.resource_name)

    on_resource = [x for x in bindings if applies(x)]
    if not on_resource:
        return allow_if_no_acls
    mine = [x for x in on_resource if x.principal in (principal, "User:*") and x.host in (host, "*")]
    if any(x.permission == DENY and x.operation in (op, Operation.ALL) for x in mine):
        return False
    implied = {Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}}.get(op, set())
    return any(x.permission == ALLOW and (x.operation in (op, Operation.ALL) or x.operation in implied) for x in mine)


@settings(max_examples=400, deadline=None)
@given(st.lists(bindings_st, max_size=12), request_st, st.booleans())
def test_indexed_decision_equals_the_plain_rules(bindings, request, allow_if_no_acls):
    authorizer = Authorizer(bindings, allow_if_no_acls=allow_if_no_acls)
    assert authorizer.authorize(*request) == _reference(bindings, *request, allow_if_no_acls=allow_if_no_acls)


@settings(max_examples=300, deadline=None)
@given(st.lists(bindings_st, max_size=10), request_st)
def test_deny_wins_and_allow_is_monotonic(bindings, request):
    principal, host, op, rtype, name = request
    before = Authorizer(bindings).authorize(*request)
    deny = AclBinding(rtype, name, LIT, principal, host, op, DENY)
    assert not Authorizer([*bindings, deny]).authorize(*request)
    allow = AclBinding(rtype, name, LIT, principal, host, op, ALLOW)
    assert Authorizer([*bindings, allow]).authorize(*request) == (not any(
        x.permission == DENY and x.operation in (op, Operation.ALL) and x.principal in (principal, "User:*")
        and x.host in (host, "*") and (x.resource_name in (name, "*") if x.pattern_type == LIT
                                       else name.startswith(x.resource_name)) and x.resource_type == rtype
        for x in bindings))
    if before:
        assert Authorizer([*bindings, AclBinding(rtype, "zzz", LIT, principal, host, op, ALLOW)]).authorize(*request)
    assert Authorizer([*bindings, deny], super_users=[principal]).authorize(*request)


@settings(max_examples=300, deadline=None)
@given(st.lists(bindings_st, max_size=12), st.sampled_from([T, G]), st.sampled_from(["a", "ab", "abc", "b", "c"]))
def test_match_filter_selects_what_decisions_consider(bindings, rtype, name):
    authorizer = Authorizer(bindings)
    selected = set(authorizer.matching(AclBindingFilter(rtype, name, PatternType.MATCH)))
    assert selected == {x for x in set(bindings) if x in authorizer._applicable(rtype, name)}
