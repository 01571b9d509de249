"""Run one claimed invocation: load its payload, call it, encode what happened.

Nothing here talks to the plane: blobs (function bodies, large arguments) come from a
:class:`BlobSource`, output and progress go to the hooks the caller passes, and the
caller reports the :class:`Outcome`. Loading failures (a module missing on this
worker, a Python or pickle protocol this worker cannot read) are not retried: they
would fail the same way again.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import linecache
import os
import pickle
import subprocess
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ..errors import InvalidRequest, SerializationError
from ..plane.model import Claim
from ..progress import Reporter, reporting
from ..wire import (
    PY_VERSION,
    clipped,
    decode_payload,
    encode_error,
    encode_manifest,
    encode_result,
    verified,
)

__all__ = ["BlobSource", "Executor", "Outcome", "OutputHook"]

#: ``hook(stream, text)`` receives a job's output as it is written
OutputHook = Callable[[str, str], None]


class BlobSource(Protocol):
    """Where an executor reads blobs (a Transport is one)."""

    def get_blob(self, digest: str) -> bytes: ...

    def inline_limit(self) -> int: ...


def read_unchecked(source: BlobSource, digest: str) -> bytes:
    """A blob's bytes for an executor, which checks every blob against its digest before
    it loads it: read from a remote plane without the transport's own check (one hash of
    the bytes, not two)."""
    from ..http import HttpTransport  # (a worker on a plane file never needs it)

    if isinstance(source, HttpTransport):
        return source.get_blob(digest, check=False)
    return source.get_blob(digest)


#: the error type of a call this worker cannot load (no exception underneath)
_LOAD_ERROR = "dreamlake.lakeshore.CannotLoad"
#: how many loaded functions a worker keeps, by digest
_FN_CACHE = 256


@dataclass(frozen=True)
class Outcome:
    ok: bool
    result: bytes | None = None
    #: blobs the result references (a result over the inline limit)
    blobs: dict[str, bytes] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    #: a raise may be retried by policy; a payload that cannot load may not
    retryable: bool = True
    #: a data UDF's keys (it returned a bare str), to check before recording
    manifest: list[str] | None = None


class _LoadError(Exception):
    """The payload could not be turned into a call on this worker."""


class Executor:
    """Runs claims in the calling thread. Caches function bodies by digest."""

    def __init__(self, source: BlobSource) -> None:
        self._source = source
        self._fns: OrderedDict[str, Callable[..., Any]] = OrderedDict()

    def run(
        self,
        claim: Claim,
        *,
        on_output: OutputHook | None = None,
        on_spawn: Callable[[int], None] | None = None,
        progress: Reporter | None = None,
    ) -> Outcome:
        """Run the claim. ``on_output`` gets an exec job's output (a Python job's goes
        wherever its ``sys.stdout`` points); ``on_spawn(pid)`` the process group of an
        exec job; ``progress`` the job's :func:`dreamlake.lakeshore.progress` calls."""
        try:
            env = decode_payload(claim.payload)
            call, prefer_msgpack = self._load(env, on_output, on_spawn)
        except (_LoadError, InvalidRequest) as exc:
            underneath = exc.__cause__ if isinstance(exc, _LoadError) else exc
            if underneath is None:
                # nothing underneath to re-raise: the producer gets RemoteError
                error = {
                    "type": _LOAD_ERROR,
                    "message": clipped(str(exc)),
                    "traceback": "",
                    "pickled": None,
                }
            else:
                error = encode_error(underneath)
                error["message"] = clipped(str(exc))
            return Outcome(ok=False, error=error, retryable=False)
        try:
            with reporting(progress):
                value = call()
                if inspect.isawaitable(value):
                    value = asyncio.run(_await(value))
        except (Exception, SystemExit) as exc:  # a job calling sys.exit() must not end us
            return Outcome(ok=False, error=encode_error(exc))
        if isinstance(value, str):
            keys = [line.strip() for line in value.splitlines() if line.strip()]
            return Outcome(ok=True, result=encode_manifest(value, keys), manifest=keys)
        try:
            limit = self._source.inline_limit()
            data, blobs = encode_result(value, prefer_msgpack=prefer_msgpack, inline_limit=limit)
            return Outcome(ok=True, result=data, blobs=blobs)
        except SerializationError as exc:
            return Outcome(ok=False, error=encode_error(exc), retryable=False)

    # --- loading ---------------------------------------------------------------
    def _load(
        self,
        env: dict[str, Any],
        on_output: OutputHook | None,
        on_spawn: Callable[[int], None] | None,
    ) -> tuple[Callable[[], Any], bool]:
        kind = env["kind"]
        if kind == "pickle":
            fn = self._function(env)
            try:
                raw = env.get("args")
                if raw is None:
                    raw = verified(env["args_ref"], self._source.get_blob(env["args_ref"]))
                args, kwargs = pickle.loads(raw)
            except Exception as exc:
                raise _LoadError(self._load_message("its arguments", env, exc)) from exc
            return (lambda: fn(*args, **kwargs)), False
        if kind == "ref":
            target = _resolve(env["target"])
            args, kwargs = env["args"], env["kwargs"]
            return (lambda: target(*args, **kwargs)), True
        return (lambda: _run_exec(env, on_output, on_spawn)), True

    def _function(self, env: dict[str, Any]) -> Callable[..., Any]:
        proto = env.get("proto")
        if isinstance(proto, int) and proto > pickle.HIGHEST_PROTOCOL:
            raise _LoadError(
                f"the call was pickled with protocol {proto} (producer Python {env.get('py')}); "
                f"this worker's Python {PY_VERSION} reads up to {pickle.HIGHEST_PROTOCOL}: "
                "submit by reference, 'module:function', to cross versions"
            )
        digest = env["fn"]
        fn = self._fns.get(digest)
        if fn is not None:
            self._fns.move_to_end(digest)
            return fn
        try:
            body = verified(digest, self._source.get_blob(digest))
        except Exception as exc:
            raise _LoadError(f"function body {digest[:12]}… is not on the plane: {exc}") from exc
        try:
            loaded = pickle.loads(body)
        except Exception as exc:
            raise _LoadError(self._load_message(f"function {env.get('name')}", env, exc)) from exc
        if not callable(loaded):
            raise _LoadError(f"payload function {env.get('name')} is not callable")
        fn = cast(Callable[..., Any], loaded)
        _name_files(fn)
        self._fns[digest] = fn
        if len(self._fns) > _FN_CACHE:
            self._fns.popitem(last=False)
        return fn

    @staticmethod
    def _load_message(what: str, env: dict[str, Any], exc: BaseException) -> str:
        msg = f"cannot load {what} on this worker: {type(exc).__name__}: {exc}"
        producer = env.get("py")
        if producer and producer != PY_VERSION:
            msg += (
                f" (producer Python {producer}, pickle protocol {env.get('proto')}; "
                f"worker Python {PY_VERSION}: submit by reference, 'module:function', "
                "to cross versions)"
            )
        return msg


#: the file cloudpickle names for code it sends by value (so a payload is the same
#: wherever its function was defined)
_DYNAMIC = "<dynamic-code>"


def _name_files(fn: Any) -> None:
    """Give code sent by value its file back, so a remote traceback says where each
    frame is (its line numbers were right all along): cloudpickle ships such code as
    from ``<dynamic-code>``, and keeps its module's ``__file__`` in the globals it
    rebuilds. The function and the by-value functions and methods sharing those globals
    (the helpers of the same script), nested code included, are named from it. A
    function defined where there is no file (a notebook cell) keeps the placeholder,
    and so does one sent by reference (its code names its file already). The file is
    the producer's: its lines are shown only where the worker's file at that path has
    the function where its code says (else none, rather than another file's). Cosmetic:
    whatever goes wrong here leaves the function as it came."""
    code = getattr(fn, "__code__", None)
    scope = getattr(fn, "__globals__", None)
    if not isinstance(code, types.CodeType) or code.co_filename != _DYNAMIC:
        return
    if not isinstance(scope, dict):
        return
    path = scope.get("__file__")
    if not isinstance(path, str) or not path:
        return
    try:
        found: list[Any] = [fn, *scope.values()]
        for value in list(found[1:]):
            if isinstance(value, type):
                found.extend(vars(value).values())
        for value in found:
            if isinstance(value, staticmethod | classmethod | types.MethodType):
                value = value.__func__
            if (
                isinstance(value, types.FunctionType)
                and value.__globals__ is scope
                and value.__code__.co_filename == _DYNAMIC
            ):
                value.__code__ = _named(value.__code__, path)
        _lines_or_none(path, code)
    except Exception:
        pass


def _lines_or_none(path: str, code: types.CodeType) -> None:
    """Keep a traceback from showing another file's lines for ``path``: unless the
    worker's file at ``path`` defines ``code`` where it starts (its decorators first),
    tell ``linecache`` the file has none (an entry without a time, which its checks
    leave alone)."""
    first = code.co_firstlineno
    head = "".join(linecache.getline(path, n) for n in range(first, first + _DECORATORS))
    if f"def {code.co_name}(" not in head and "lambda" not in head:
        linecache.cache[path] = (0, None, [], path)


#: lines a function's decorators may take before its ``def``
_DECORATORS = 20


def _named(code: types.CodeType, path: str) -> types.CodeType:
    consts = tuple(
        _named(c, path) if isinstance(c, types.CodeType) and c.co_filename == _DYNAMIC else c
        for c in code.co_consts
    )
    return code.replace(co_filename=path, co_consts=consts)


async def _await(value: Any) -> Any:
    return await value


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, attr_path = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise _LoadError(
            f"cannot load {target} on this worker: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(obj):
        raise _LoadError(f"{target} is not callable")
    fn: Callable[..., Any] = obj
    return fn


def _run_exec(
    env: dict[str, Any], on_output: OutputHook | None, on_spawn: Callable[[int], None] | None
) -> dict[str, Any]:
    """Run a shell command (str) or argv (list) in its own process group, streaming its
    output line by line; raise CalledProcessError on a non-zero exit."""
    cmd = env["cmd"]
    proc = subprocess.Popen(
        cmd,
        shell=isinstance(cmd, str),
        env={**os.environ, **{str(k): str(v) for k, v in env["env"].items()}},
        cwd=env.get("cwd") or None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own process group: a cancel kills all of it
    )
    if on_spawn is not None:
        on_spawn(proc.pid)
    captured: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def pump(stream: str, pipe: Any) -> None:
        for line in pipe:
            captured[stream].append(line)
            if on_output is not None:
                on_output(stream, line)

    readers = [
        threading.Thread(target=pump, args=("stdout", proc.stdout), daemon=True),
        threading.Thread(target=pump, args=("stderr", proc.stderr), daemon=True),
    ]
    for t in readers:
        t.start()
    code = proc.wait()
    for t in readers:
        t.join()
    out, err = "".join(captured["stdout"]), "".join(captured["stderr"])
    if code != 0:
        raise subprocess.CalledProcessError(code, cmd, out, err)
    return {"exit_code": code, "stdout": out, "stderr": err}
