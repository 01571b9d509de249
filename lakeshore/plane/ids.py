"""Invocation ids that share a group: how a batch of submits is told apart.

An invocation id is 1 to 128 characters that one path segment of the API's routes can
name (:func:`nameable`: letters, digits, spaces and the URI's other safe characters; no
``/``, ``?``, ``#``, quotes or control characters). Ids a client makes for a
batch of submits share a *group*: a 26-character base (:func:`dreamlake.lakeshore.submit.new_id`)
and one more character after a dot, ``<base>.<c>``, for up to :data:`GROUP_SIZE` ids.
A store may keep a group's records together (the DynamoDB store keeps them in one item:
one write for a claim or a completion of many, see docs/cost.md); nothing else depends
on it. Grouping is only ever an optimisation: every id, grouped or not, has the same
semantics, and an id that merely looks grouped is stored in that group like any other.
"""

from __future__ import annotations

import re

__all__ = ["GROUP_ALPHABET", "GROUP_SIZE", "group_ids", "group_of", "nameable"]

#: what an id may hold (``GET /v1/invocations/{id}`` takes word characters and these)
_NAMEABLE = re.compile(r"[\w\-._~()'!*:@,;=+&$%<> \[\]{}|^]{1,128}")


def nameable(inv_id: str) -> bool:
    """Whether ``inv_id`` is a valid invocation id: one every route can name."""
    return _NAMEABLE.fullmatch(inv_id) is not None


#: the digits of an id's base and of the character after the dot, in order (Crockford's
#: base32, lower case)
GROUP_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
#: how many ids share one group at most
GROUP_SIZE = 16

_DIGIT = f"[{GROUP_ALPHABET}]"
_GROUPED = re.compile(rf"^({_DIGIT}{{26}})\.({_DIGIT})$")


def group_of(inv_id: str) -> str:
    """The group an id belongs to: its base for a grouped id, else the id itself."""
    m = _GROUPED.match(inv_id)
    if m is None or GROUP_ALPHABET.index(m.group(2)) >= GROUP_SIZE:
        return inv_id
    return m.group(1)


def group_ids(base: str, n: int) -> list[str]:
    """The first ``n`` (at most :data:`GROUP_SIZE`) ids of the group ``base``."""
    if not 0 < n <= GROUP_SIZE:
        raise ValueError(f"a group holds 1 to {GROUP_SIZE} ids")
    return [f"{base}.{c}" for c in GROUP_ALPHABET[:n]]
