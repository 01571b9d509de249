"""``@udf``: bind a function to a queue; ``.submit()`` runs it on a worker.

``square(3)`` still runs locally. ``square.submit(3, _dispatch=dp)`` returns the durable
invocation id. Keywords starting with ``_`` are Lakeshore's options; all others go to
the function. Type checkers see ``submit``'s parameters as the function's own
(``ParamSpec``); :meth:`UDF.options` sets Lakeshore's options in a fully typed way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from .dispatch import Dispatch
from .plane.model import RetryPolicy
from .queue import _QueueHandle, handle_for
from .submit import SubmitOptions
from .wire import pickle_function

__all__ = ["UDF", "udf"]

P = ParamSpec("P")
R = TypeVar("R")


class UDF(Generic[P, R]):
    """A function bound to a queue."""

    def __init__(self, fn: Callable[P, R], queue: _QueueHandle, defaults: SubmitOptions) -> None:
        self.fn = fn
        self.queue = queue
        self.defaults = defaults
        self._body: bytes | None = None
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<udf {getattr(self.fn, '__qualname__', self.fn)!r} on {self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here, now (no plane involved)."""
        return self.fn(*args, **kwargs)

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue a call; return its invocation id once the plane has it."""
        opts, fn_kwargs = SubmitOptions.split(dict(kwargs), self.defaults)
        if self._body is None:
            # Pickled once per handle, as Ray does for remote functions: globals the
            # body captures by value are those of the first submit.
            self._body = pickle_function(self.fn)
        return self.queue._submit(self.fn, args, fn_kwargs, opts, body=self._body)

    def options(
        self,
        *,
        dispatch: Dispatch | None = None,
        priority: float | None = None,
        delay: float | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        retry: RetryPolicy | int | None = None,
    ) -> UDF[P, R]:
        """A copy of this handle with other default options for ``submit``."""
        given = {
            "_dispatch": dispatch,
            "_priority": priority,
            "_delay": delay,
            "_timeout": timeout,
            "_max_attempts": max_attempts,
            "_idempotency_key": idempotency_key,
            "_retry": retry,
        }
        opts, _ = SubmitOptions.split(
            {k: v for k, v in given.items() if v is not None}, self.defaults
        )
        copy = UDF(self.fn, self.queue, opts)
        copy._body = self._body
        return copy


@overload
def udf(fn: Callable[P, R], /) -> UDF[P, R]: ...


@overload
def udf(
    *,
    queue: str | _QueueHandle = ...,
    retry: RetryPolicy | int | None = ...,
    timeout: float | None = ...,
    max_attempts: int | None = ...,
    dispatch: Dispatch | None = ...,
    **queue_options: Any,
) -> Callable[[Callable[P, R]], UDF[P, R]]: ...


def udf(
    fn: Callable[P, R] | None = None,
    /,
    *,
    queue: str | _QueueHandle = "default",
    retry: RetryPolicy | int | None = None,
    timeout: float | None = None,
    max_attempts: int | None = None,
    dispatch: Dispatch | None = None,
    **queue_options: Any,
) -> UDF[P, R] | Callable[[Callable[P, R]], UDF[P, R]]:
    """Bind a function to a queue: ``@udf(queue="name")`` or ``@udf(queue=q)``.

    A string makes the queue handle, and the queue keywords pick its class
    (``priority_field=`` → PriorityQueue, ``temperature=``/``anneal=`` →
    BoltzmannQueue, else Queue; ``kind=``, ``strict=``, ``namespace=``, ``scope=``
    and ``elasticity=`` pass through); ``retry``, ``timeout`` and ``max_attempts`` are the
    defaults of every submit (each overridable with ``_retry=`` and so on).
    """
    if isinstance(queue, _QueueHandle):
        if queue_options:
            raise TypeError(
                f"queue settings ({', '.join(sorted(queue_options))}) belong on the "
                "queue handle when @udf is given one"
            )
        handle = queue
    elif isinstance(queue, str):
        handle = handle_for(queue, dispatch=dispatch, **queue_options)
    else:
        raise TypeError(f"udf(queue=...) takes a queue name or a Queue, not {type(queue).__name__}")
    defaults, _ = SubmitOptions.split(
        {
            k: v
            for k, v in {
                "_retry": retry,
                "_timeout": timeout,
                "_max_attempts": max_attempts,
            }.items()
            if v is not None
        }
    )

    def bind(f: Callable[P, R]) -> UDF[P, R]:
        return UDF(f, handle, defaults)

    return bind if fn is None else bind(fn)
