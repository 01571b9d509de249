"""``HttpTransport``: the :class:`~..transport.Transport` of a remote plane (HTTP API v1).

::

    dp = Dispatch("https://abc.execute-api.us-east-1.amazonaws.com", token="lks_…")

Every call is msgpack both ways with ``Authorization: Bearer <token>``, over the stdlib
``http.client``: one keep-alive connection per thread and origin, TCP_NODELAY, reopened
when the server has dropped it. Connection errors, ``429`` (after its ``Retry-After``)
and ``5xx`` answers are retried with capped exponential backoff and jitter. Repeating is
safe on every route: submit is idempotent on the id the SDK always chooses; heartbeat,
cancel, priority and queue settings are idempotent; complete and fail are guarded by the
lease token, so a repeat after a lost answer is refused (``LeaseLost``), never recorded
twice. A claim whose answer is lost leaves a lease nobody holds: it runs out and the
invocation is handed on, as for a crashed worker (execution is at-least-once anyway).

Result watches are coalesced: all ids watched through one transport are awaited by one
background long-poll, ``POST /v1/invocations/wait`` over the whole set
(:class:`~.watches.Watches`).

The plane's clock is the one that counts (expiry, ``scheduled``): :meth:`HttpTransport.now`
is this machine's clock corrected by the offset measured at ``GET /v1/hello``.

The parts; each imports only parts listed after it (``watches`` names ``HttpTransport``
for its types alone):

- :mod:`.transport`: :class:`HttpTransport`, the methods over the API routes;
- :mod:`.watches`: the coalescing long-poll behind :meth:`HttpTransport.watch`;
- :mod:`.views`: wire views ↔ the plane's model objects;
- :mod:`.limits`: :class:`Limits` from hello, and batches cut to fit them;
- :mod:`.session`: one call with retries, headers, URLs, per-thread connections;
- :mod:`.answers`: an answer's body as a map and its error as an exception;
- :mod:`.connections`: sockets, keep-alive, one request on one connection.
"""

from __future__ import annotations

from .limits import Limits
from .transport import HttpTransport

__all__ = ["HttpTransport", "Limits"]
