"""Job handlers: what a worker runs for a job, found by the job's ``handler`` reference.

The worker decodes a job message into a :class:`JobContext`, asks the :class:`HandlerRegistry` for
the handler named by the schedule (``builtin:noop``, ``builtin:sleep``, ``builtin:fail``,
``builtin:http``, or a ``package.module:function`` its operator registered) and calls it, awaiting
it when :meth:`HandlerRegistry.is_async` says so. A reference nobody registered is refused without
importing anything (:class:`HandlerNotRegistered`, not retryable). A handler's outcome decides the
run's fate: returning (a JSON-able result or ``None``) is success; raising :class:`HandlerError`
carries its own classification (``retryable`` goes to the retry topic, anything else straight to
the dead-letter topic); any other exception is treated as retryable, because an unexpected crash
may well be transient. :func:`describe_failure` is the one place that turns an exception into that
classification.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import EntryPoint
from types import ModuleType
from typing import Any
from uuid import UUID

from scheduler.telemetry.redact import redact_text
from scheduler.worker.builtin_payloads import fail_problem, sleep_problem

# Long sleeps tell the scheduler they are alive this often, well inside any sensible lease.
HEARTBEAT_INTERVAL_S = 5.0
# The handlers this package ships are named with it (``builtin:noop``).
BUILTIN_PREFIX = "builtin:"

# ``package.module:attribute`` where the attribute may itself be dotted (``module:Class.method``).
_PYTHON_REF_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class JobContext:
    """Everything a handler may know about the attempt it is running."""

    run_id: UUID
    schedule_id: UUID
    app: str
    attempt: int
    max_attempts: int
    idempotency_key: str
    scheduled_for: datetime
    deadline: datetime
    payload: Any
    heartbeat: Callable[[], None]


class HandlerError(Exception):
    """A handler failure that knows whether trying again can help.

    ``error_class`` names the failure in run records and dead letters; it defaults to the class name
    so that subclasses classify themselves, and a handler may pass a more specific one.
    """

    retryable: bool = True
    error_class: str

    def __init__(
        self, message: str, *, retryable: bool | None = None, error_class: str | None = None
    ) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable
        self.error_class = error_class or type(self).__name__


class NonRetryableError(HandlerError):
    """A failure that will fail the same way every time: the run goes straight to ``dead``."""

    retryable = False


class HandlerNotFound(NonRetryableError):
    """The handler reference names nothing callable; retrying cannot fix a bad reference."""


class HandlerExited(HandlerError):
    """A handler raised what ends a program or a thread (``SystemExit``, ``KeyboardInterrupt``,
    ``GeneratorExit``, a ``CancelledError`` the worker did not ask for): it fails the attempt as any
    unexpected error does, and never the worker's job loop."""

    def __init__(self, raised: BaseException) -> None:
        name = type(raised).__name__
        detail = _one_line(raised)
        super().__init__(f"the handler raised {name}({detail})" if detail else f"the handler raised {name}")
        self.error_class = name


Handler = Callable[[JobContext], Any]


@dataclass(frozen=True)
class Failure:
    """How a handler's exception is reported: retry or not, a short class name, one line of text."""

    retryable: bool
    error_class: str
    message: str


def describe_failure(exc: BaseException) -> Failure:
    """Classify any exception a handler raised; unknown exceptions are retryable."""
    retryable, error_class = classify(exc)
    return Failure(retryable, error_class, _one_line(exc) or type(exc).__name__)


def classify(exc: BaseException) -> tuple[bool, str]:
    """Whether a handler's exception is worth another attempt, and its error class; never raises.

    A :class:`HandlerError` carries both. What its class broke (an ``__init__`` that never called
    ours leaves no ``error_class``; a property may raise) is as any unexpected exception's: its
    class name, retryable.
    """
    name = type(exc).__name__
    if not isinstance(exc, HandlerError):
        return True, name
    try:
        retryable = bool(exc.retryable)
    except Exception:
        retryable = True
    try:
        error_class = exc.error_class
    except Exception:
        error_class = name
    return retryable, error_class if isinstance(error_class, str) and error_class else name


def error_text(exc: BaseException) -> str:
    """``str(exc)`` of an exception a handler raised, never an exception itself.

    ``str()`` runs the exception class's own ``__str__``, the handler's code: one that raises (or
    returns no text) would otherwise escape from the worker's description of the failure and be
    taken for the worker's own fault. Its class still names the failure; the text says why there
    is no message."""
    try:
        # A str subclass (whose methods the class may have changed too) becomes a plain str here.
        return str.__str__(str(exc))
    except BaseException as failed:  # the handler's code: whatever it raises, as the handler's own
        return f"{type(exc).__name__} (its message could not be formatted: {type(failed).__name__})"


# --- built-in handlers -------------------------------------------------------------------------


def noop(ctx: JobContext) -> None:
    """Do nothing. The hot path of the throughput benchmark, so it must stay this cheap."""
    return None


async def sleep(ctx: JobContext) -> None:
    """Sleep ``payload["seconds"]``, heartbeating so a long sleep keeps its lease."""
    # Errors say what the payload is shaped like, never what is in it: they are stored and logged.
    if problem := sleep_problem(ctx.payload):
        raise NonRetryableError(problem)
    seconds = ctx.payload["seconds"]
    loop = asyncio.get_running_loop()
    wake_at = loop.time() + seconds
    while (remaining := wake_at - loop.time()) > 0:
        await asyncio.sleep(min(remaining, HEARTBEAT_INTERVAL_S))
        if wake_at - loop.time() > 0:
            ctx.heartbeat()


def fail(ctx: JobContext) -> dict[str, int]:
    """Fail while ``ctx.attempt <= payload["times"]``, then succeed: a way to exercise retries and the
    dead-letter path on purpose. Without ``times`` it fails every attempt."""
    if problem := fail_problem(ctx.payload):
        raise NonRetryableError(problem)
    payload = ctx.payload if ctx.payload is not None else {}
    times = payload.get("times")
    retryable = payload.get("retryable", True)
    if times is None or ctx.attempt <= times:
        planned = "every attempt" if times is None else f"the first {times}"
        raise HandlerError(
            f"planned failure on attempt {ctx.attempt} of {ctx.max_attempts} (builtin:fail fails {planned})",
            retryable=retryable,
            error_class="PlannedFailure",
        )
    return {"attempt": ctx.attempt}


_BUILTINS: dict[str, Handler] = {"noop": noop, "sleep": sleep, "fail": fail}
_BUILTIN_NAMES = ", ".join(sorted([*_BUILTINS, "http"]))


# --- the registry ------------------------------------------------------------------------------

ENTRY_POINT_GROUP = "scheduler.handlers"
"""Installed packages register their handlers under this entry point group (``module`` or ``module:attr``)."""

# A registered entry: ``package.module`` (its public callables) or ``package.module:attribute``.
_ENTRY_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?$")
_LISTED_ENTRIES = 5


class InvalidRegistration(ValueError):
    """A handler entry of the worker's configuration that cannot be loaded: the worker does not start."""


class HandlerNotRegistered(HandlerNotFound):
    """The reference names a module or function this worker was not configured to run. Its module is
    never imported: an import runs code, and only the operator decides which code a worker runs."""


class HandlerRegistry:
    """Turns handler references into callables: the builtins, plus what the operator registered.

    ``registered`` entries (``SCHEDULER_HANDLERS``, ``--handler``) and the installed entry points of
    :data:`ENTRY_POINT_GROUP` are imported here, at start-up, so that a bad one stops the worker with
    one line rather than failing its jobs. A ``package.module`` entry allows every public callable defined in
    that module (``package.module:name``, also ``package.module:Class.method``), never one it
    imported; a
    ``package.module:function`` entry allows exactly that one. Any other reference is refused
    without importing anything.

    Both outcomes of a lookup are cached: a good reference is a dictionary lookup from then on.
    """

    def __init__(
        self,
        http_allowlist: Sequence[str] = (),
        registered: Sequence[str] = (),
        *,
        entry_points: Iterable[EntryPoint] | None = None,
    ) -> None:
        self._http_allowlist = tuple(http_allowlist)
        if self._http_allowlist:
            # Parse it now so that a malformed entry stops the worker at start-up with one clear line,
            # instead of failing the first HTTP job.
            from scheduler.worker.http_handler import AddressPolicy

            AddressPolicy.from_allowlist(self._http_allowlist)
        self._resolved: dict[str, Handler] = {}
        self._failed: dict[str, HandlerNotFound] = {}
        self._modules: dict[str, ModuleType] = {}  # registered whole: their public callables
        self._entries: list[str] = []
        installed = (
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if entry_points is None else entry_points
        )
        sources = [
            (entry.strip(), "SCHEDULER_HANDLERS or --handler") for entry in registered if entry.strip()
        ]
        sources += [
            (ep.value.strip(), f"entry point {ep.name!r} of group {ENTRY_POINT_GROUP}") for ep in installed
        ]
        for entry, origin in sources:
            self._register(entry, origin)

    @property
    def registered(self) -> tuple[str, ...]:
        """The entries this registry loaded, in order (the builtins are always there too)."""
        return tuple(self._entries)

    def _register(self, entry: str, origin: str) -> None:
        if entry in self._entries:
            return
        if not _ENTRY_RE.match(entry) or entry.startswith(BUILTIN_PREFIX):
            raise InvalidRegistration(
                f"handler registration {entry!r} ({origin}): "
                "expected package.module or package.module:function"
            )
        module_name, _, attribute_path = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
        except (Exception, SystemExit) as exc:  # a module may raise anything while it is imported
            # Its text may quote what the module connects to at import (a URL with its password):
            # redacted as any log line is, since the line reaches the terminal and the pod's log.
            # A sys.exit (argparse reading the worker's arguments at import) would end the worker
            # there, with exit 0 and nothing said: a registration that failed, as any other.
            exited = " (the module called sys.exit while imported)" if isinstance(exc, SystemExit) else ""
            detail = redact_text(_one_line(exc))
            raise InvalidRegistration(
                f"handler registration {entry!r} ({origin}): cannot import {module_name!r}: "
                f"{type(exc).__name__}{': ' + detail if detail else ''}{exited}"
            ) from exc
        if attribute_path:
            try:
                self._resolved[entry] = _walk(entry, module, attribute_path, public_only=False)
            except HandlerNotFound as exc:
                reason = str(exc).removeprefix(f"handler {entry!r}: ")
                raise InvalidRegistration(f"handler registration {entry!r} ({origin}): {reason}") from None
        else:
            self._modules[module_name] = module
        self._entries.append(entry)

    def resolve(self, ref: str) -> Handler:
        """The handler named by ``ref``; :class:`HandlerNotFound` with a one-line reason if none."""
        handler = self._resolved.get(ref)
        if handler is not None:
            return handler
        refused = self._failed.get(ref)
        if refused is None:
            try:
                handler = self._load(ref)
            except HandlerNotFound as exc:
                refused = self._failed[ref] = exc
            else:
                self._resolved[ref] = handler
                return handler
        # A fresh exception each time: one raised before carries the traceback of its first job.
        raise type(refused)(str(refused))

    @staticmethod
    def is_async(handler: Handler) -> bool:
        """Whether calling ``handler`` gives a coroutine to await (``async def``, also as ``__call__``)."""
        return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            type(handler).__call__  # a callable object whose __call__ is async
        )

    def _load(self, ref: str) -> Handler:
        if ref.startswith(BUILTIN_PREFIX):
            name = ref.removeprefix(BUILTIN_PREFIX)
            if name == "http":
                # Imported here, not at the top: httpx costs a noticeable import time that workers
                # running only Python or the other builtins should not pay.
                from scheduler.worker.http_handler import HttpHandler

                return HttpHandler(self._http_allowlist)
            builtin = _BUILTINS.get(name)
            if builtin is None:
                raise HandlerNotFound(f"unknown builtin handler {ref!r} (known: {_BUILTIN_NAMES})")
            return builtin
        if not _PYTHON_REF_RE.match(ref):
            raise HandlerNotFound(
                f"bad handler reference {ref!r}: expected builtin:NAME or package.module:function"
            )
        module_name, _, attribute_path = ref.partition(":")
        module = self._modules.get(module_name)
        if module is None:
            listed = ", ".join(self._entries[:_LISTED_ENTRIES]) or "none"
            if len(self._entries) > _LISTED_ENTRIES:
                listed += f" and {len(self._entries) - _LISTED_ENTRIES} more"
            raise HandlerNotRegistered(
                f"this worker does not run handler {ref!r} (registered: {listed}; the builtins always run): "
                "register its module or function with SCHEDULER_HANDLERS or --handler"
            )
        return _walk(ref, module, attribute_path, public_only=True)


def _walk(ref: str, module: ModuleType, attribute_path: str, *, public_only: bool) -> Handler:
    """The callable at ``attribute_path`` in ``module``. Of a module registered whole, only public
    attributes defined there count: never a private one, and never one it merely imported, itself
    or through a module or class it imported (``mod:os.system``, ``mod:getcwd`` after ``from os
    import getcwd``, ``mod:pformat``: not the module's to offer)."""
    target: Any = module
    walked = module.__name__
    for name in attribute_path.split("."):
        if public_only and name.startswith("_"):
            raise HandlerNotFound(f"handler {ref!r}: {name!r} is private to {walked!r}")
        try:
            target = getattr(target, name)
        except AttributeError:
            raise HandlerNotFound(f"handler {ref!r}: {walked!r} has no attribute {name!r}") from None
        except Exception as exc:
            # A module's lazy __getattr__ (an optional import) or a property may raise anything: the
            # reference names no handler, said in one line, redacted as an import's error is.
            raise HandlerNotFound(
                f"handler {ref!r}: looking up {name!r} in {walked!r} raised "
                f"{type(exc).__name__}: {redact_text(_one_line(exc))}"
            ) from None
        if public_only and isinstance(target, ModuleType):
            raise HandlerNotFound(f"handler {ref!r}: {name!r} is a module, not a handler of {walked!r}")
        if public_only and isinstance(target, type):
            _defined_in(ref, module, name, target)
        walked = f"{walked}:{name}" if walked == module.__name__ else f"{walked}.{name}"
    if not callable(target):
        raise HandlerNotFound(f"handler {ref!r}: {type(target).__name__} object is not callable")
    if public_only:
        _defined_in(ref, module, attribute_path.rsplit(".", 1)[-1], target)
    handler: Handler = target
    return handler


def _defined_in(ref: str, module: ModuleType, name: str, target: Any) -> None:
    origin = getattr(target, "__module__", None)
    if origin != module.__name__:
        came_from = f" (it comes from {origin!r})" if isinstance(origin, str) else ""
        raise HandlerNotFound(f"handler {ref!r}: {name!r} is not defined in {module.__name__!r}{came_from}")


def _one_line(exc: BaseException) -> str:
    return " ".join(error_text(exc).split())
