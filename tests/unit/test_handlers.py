"""The handler registry (builtins plus registered entries only), the builtins, Python callables, and
which HTTP targets are refused."""

from __future__ import annotations

import asyncio
import ipaddress
import os
from collections.abc import Sequence
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from scheduler.worker import handlers
from scheduler.worker.handlers import (
    ENTRY_POINT_GROUP,
    HandlerError,
    HandlerExited,
    HandlerNotFound,
    HandlerNotRegistered,
    HandlerRegistry,
    InvalidRegistration,
    NonRetryableError,
    describe_failure,
)
from scheduler.worker.http_handler import (
    AddressPolicy,
    HttpRequest,
    TargetRefused,
    classify_address,
    resolve_host,
)
from tests.unit.handler_fixtures import job_context

FIXTURES = "tests.unit.handler_fixtures"


def run(registry: HandlerRegistry, ref: str, payload: Any = None, **context: Any) -> Any:
    handler = registry.resolve(ref)
    ctx = job_context(payload, **context)
    if HandlerRegistry.is_async(handler):
        return asyncio.run(handler(ctx))
    return handler(ctx)


@pytest.fixture
def registry() -> HandlerRegistry:
    return HandlerRegistry(registered=[FIXTURES], entry_points=())


# --- builtins ------------------------------------------------------------------------------------


def test_noop_is_sync_and_returns_nothing(registry: HandlerRegistry) -> None:
    handler = registry.resolve("builtin:noop")
    assert not HandlerRegistry.is_async(handler)
    assert handler(job_context()) is None
    assert registry.resolve("builtin:noop") is handler


def test_fail_fails_the_first_n_attempts_then_succeeds(registry: HandlerRegistry) -> None:
    for attempt in (1, 2):
        with pytest.raises(HandlerError) as failed:
            run(registry, "builtin:fail", {"times": 2}, attempt=attempt)
        assert failed.value.retryable
        assert failed.value.error_class == "PlannedFailure"
        assert f"attempt {attempt} of 3" in str(failed.value)
    assert run(registry, "builtin:fail", {"times": 2}, attempt=3) == {"attempt": 3}
    assert run(registry, "builtin:fail", {"times": 0}) == {"attempt": 1}


def test_fail_can_be_non_retryable(registry: HandlerRegistry) -> None:
    with pytest.raises(HandlerError) as failed:
        run(registry, "builtin:fail", {"times": 1, "retryable": False})
    assert not failed.value.retryable


def test_fail_without_times_fails_every_attempt(registry: HandlerRegistry) -> None:
    payloads: list[Any] = [None, {}]
    for payload in payloads:
        with pytest.raises(HandlerError):
            run(registry, "builtin:fail", payload, attempt=99, max_attempts=99)


@pytest.mark.parametrize(
    "payload", [{"times": "2"}, {"times": -1}, {"times": True}, {"times": 1, "retryable": "no"}, [1]]
)
def test_fail_rejects_a_bad_payload(registry: HandlerRegistry, payload: Any) -> None:
    with pytest.raises(NonRetryableError):
        run(registry, "builtin:fail", payload)


def test_sleep_sleeps_and_heartbeats(registry: HandlerRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "HEARTBEAT_INTERVAL_S", 0.01)
    beats: list[float] = []
    handler = registry.resolve("builtin:sleep")
    assert HandlerRegistry.is_async(handler)

    async def sleep() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await handler(job_context({"seconds": 0.1}, heartbeat=lambda: beats.append(loop.time())))
        assert loop.time() - started >= 0.1

    asyncio.run(sleep())
    assert len(beats) >= 3


def test_sleep_zero_returns_at_once(registry: HandlerRegistry) -> None:
    assert run(registry, "builtin:sleep", {"seconds": 0}) is None


@pytest.mark.parametrize("payload", [None, {}, {"seconds": "1"}, {"seconds": -1}, {"seconds": True}, 5])
def test_sleep_rejects_a_bad_payload(registry: HandlerRegistry, payload: Any) -> None:
    with pytest.raises(NonRetryableError):
        run(registry, "builtin:sleep", payload)


# --- Python callables ----------------------------------------------------------------------------


def test_sync_python_callable_gets_the_context(registry: HandlerRegistry) -> None:
    handler = registry.resolve(f"{FIXTURES}:echo")
    assert not HandlerRegistry.is_async(handler)
    assert run(registry, f"{FIXTURES}:echo", {"x": 1}, attempt=2) == {
        "payload": {"x": 1},
        "attempt": 2,
        "key": "key-2",
    }


def test_async_python_callable(registry: HandlerRegistry) -> None:
    assert HandlerRegistry.is_async(registry.resolve(f"{FIXTURES}:echo_async"))
    assert run(registry, f"{FIXTURES}:echo_async", [1, 2]) == {"payload": [1, 2], "async": True}


def test_dotted_attribute_and_async_callable_object(registry: HandlerRegistry) -> None:
    assert run(registry, f"{FIXTURES}:Greeter.greet", "you") == "hello you"
    assert HandlerRegistry.is_async(registry.resolve(f"{FIXTURES}:async_callable"))
    assert run(registry, f"{FIXTURES}:async_callable") == "called"


def test_a_python_handler_classifies_its_own_failure(registry: HandlerRegistry) -> None:
    with pytest.raises(NonRetryableError) as failed:
        run(registry, f"{FIXTURES}:refuse")
    assert failed.value.error_class == "UnknownCustomer"


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        ("builtin:nope", "unknown builtin handler 'builtin:nope' (known: fail, http, noop, sleep)"),
        ("no_colon_here", "expected builtin:NAME or package.module:function"),
        ("a..b:c", "expected builtin:NAME or package.module:function"),
        ("mod:", "expected builtin:NAME or package.module:function"),
        ("", "expected builtin:NAME or package.module:function"),
        (f"{FIXTURES}:missing", f"'{FIXTURES}' has no attribute 'missing'"),
        (f"{FIXTURES}:Greeter.missing", f"'{FIXTURES}:Greeter' has no attribute 'missing'"),
        (f"{FIXTURES}:NOT_CALLABLE", "int object is not callable"),
        (f"{FIXTURES}:_private", f"'_private' is private to '{FIXTURES}'"),
        # What the module imported is not its own to offer.
        (f"{FIXTURES}:time.sleep", f"'time' is a module, not a handler of '{FIXTURES}'"),
    ],
)
def test_a_bad_reference_is_not_found(registry: HandlerRegistry, ref: str, reason: str) -> None:
    with pytest.raises(HandlerNotFound) as missing:
        registry.resolve(ref)
    assert reason in str(missing.value)
    assert "\n" not in str(missing.value)
    assert not missing.value.retryable
    assert missing.value.error_class == "HandlerNotFound"


@pytest.mark.parametrize(
    "ref", ["sys:exit", "os:system", "no_such_module_xyz:run", f"{FIXTURES}.sub:run", "tests.unit:x"]
)
def test_an_unregistered_reference_is_refused(registry: HandlerRegistry, ref: str) -> None:
    for _ in range(2):  # cached, and refused the same way again
        with pytest.raises(HandlerNotRegistered) as refused:
            registry.resolve(ref)
        message = str(refused.value)
        assert message.startswith(f"this worker does not run handler {ref!r} (registered: {FIXTURES};")
        assert "SCHEDULER_HANDLERS or --handler" in message and "\n" not in message
        assert not refused.value.retryable
        assert refused.value.error_class == "HandlerNotRegistered"


def test_a_module_registered_whole_offers_only_what_it_defines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe_handlers_mod.py").write_text(
        "from os import getcwd\n"
        "from pprint import pformat\n"
        "from datetime import datetime\n"
        "from json import JSONDecoder as Decoder\n"
        "class Local:\n"
        "    borrowed = staticmethod(getcwd)\n"
        "    @staticmethod\n"
        "    def run(ctx): return 'local'\n"
        "def run(ctx): return 'defined here'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = HandlerRegistry(registered=["probe_handlers_mod"], entry_points=())
    assert run(registry, "probe_handlers_mod:run") == "defined here"
    assert run(registry, "probe_handlers_mod:Local.run") == "local"
    for ref, origin in [
        ("probe_handlers_mod:getcwd", "posix"),
        ("probe_handlers_mod:pformat", "pprint"),
        ("probe_handlers_mod:datetime.now", "datetime"),  # a class it imported, along the path
        ("probe_handlers_mod:Decoder", "json.decoder"),
        ("probe_handlers_mod:Local.borrowed", "posix"),
    ]:
        with pytest.raises(HandlerNotFound) as refused:
            registry.resolve(ref)
        assert "is not defined in 'probe_handlers_mod'" in str(refused.value), ref
        assert f"(it comes from {origin!r})" in str(refused.value), ref
    # The fixtures module's own imports are refused the same way.
    for ref in (f"{FIXTURES}:NonRetryableError", f"{FIXTURES}:datetime"):
        with pytest.raises(HandlerNotFound, match="is not defined in"):
            registry_of_fixtures().resolve(ref)
    # Named one by one, a function is the operator's explicit choice, wherever it was defined.
    chosen = HandlerRegistry(registered=["probe_handlers_mod:getcwd"], entry_points=())
    getcwd: object = chosen.resolve("probe_handlers_mod:getcwd")
    assert getcwd is os.getcwd


def registry_of_fixtures() -> HandlerRegistry:
    return HandlerRegistry(registered=[FIXTURES], entry_points=())


def test_the_builtins_alone_refuse_every_python_reference() -> None:
    bare = HandlerRegistry(entry_points=())
    assert bare.resolve("builtin:noop") is handlers.noop
    with pytest.raises(HandlerNotRegistered, match=r"\(registered: none; the builtins always run\)"):
        bare.resolve(f"{FIXTURES}:echo")


def test_an_unregistered_module_is_never_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    imports = tmp_path / "imports.log"
    (tmp_path / "side_effect_handlers_mod.py").write_text(
        f"open({str(imports)!r}, 'a').write('x')\ndef run(ctx): return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = HandlerRegistry(registered=[FIXTURES], entry_points=())
    with pytest.raises(HandlerNotRegistered):
        registry.resolve("side_effect_handlers_mod:run")
    assert not imports.exists()
    # Registered, it is imported once, at start-up, and runs.
    registered = HandlerRegistry(registered=["side_effect_handlers_mod"], entry_points=())
    assert imports.read_text() == "x"
    assert run(registered, "side_effect_handlers_mod:run") == 1
    assert imports.read_text() == "x"


def test_a_function_entry_registers_exactly_that_function() -> None:
    registry = HandlerRegistry(registered=[f"{FIXTURES}:echo", f"{FIXTURES}:Greeter.greet"], entry_points=())
    assert registry.registered == (f"{FIXTURES}:echo", f"{FIXTURES}:Greeter.greet")
    assert run(registry, f"{FIXTURES}:echo", 1)["payload"] == 1
    assert run(registry, f"{FIXTURES}:Greeter.greet", "you") == "hello you"
    with pytest.raises(HandlerNotRegistered):
        registry.resolve(f"{FIXTURES}:echo_async")


def test_installed_entry_points_register_their_handlers() -> None:
    points = [
        EntryPoint("fixtures", FIXTURES, ENTRY_POINT_GROUP),
        EntryPoint("one", "json:dumps", ENTRY_POINT_GROUP),
    ]
    registry = HandlerRegistry(entry_points=points)
    assert registry.registered == (FIXTURES, "json:dumps")
    assert run(registry, f"{FIXTURES}:echo_async", 2) == {"payload": 2, "async": True}
    with pytest.raises(HandlerNotRegistered):
        registry.resolve("json:loads")


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("not a module", "expected package.module or package.module:function"),
        ("builtin:noop", "expected package.module or package.module:function"),
        ("no_such_module_xyz", "cannot import 'no_such_module_xyz': ModuleNotFoundError"),
        (f"{FIXTURES}:missing", f"'{FIXTURES}' has no attribute 'missing'"),
        (f"{FIXTURES}:NOT_CALLABLE", "int object is not callable"),
    ],
)
def test_a_bad_entry_stops_start_up_with_one_line(entry: str, reason: str) -> None:
    with pytest.raises(InvalidRegistration) as invalid:
        HandlerRegistry(registered=[entry], entry_points=())
    message = str(invalid.value)
    assert message.startswith(f"handler registration {entry!r} (SCHEDULER_HANDLERS or --handler): ")
    assert reason in message and "\n" not in message


def test_a_module_failing_on_import_stops_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_handlers_mod.py").write_text("raise RuntimeError('no config\\nat all')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidRegistration, match=r"RuntimeError: no config at all$"):
        HandlerRegistry(registered=["broken_handlers_mod"], entry_points=())
    point = EntryPoint("broken", "broken_handlers_mod:run", ENTRY_POINT_GROUP)
    with pytest.raises(InvalidRegistration, match=r"\(entry point 'broken' of group scheduler.handlers\)"):
        HandlerRegistry(entry_points=[point])


# --- errors --------------------------------------------------------------------------------------


def test_errors_carry_their_classification() -> None:
    assert HandlerError("x").retryable and HandlerError("x").error_class == "HandlerError"
    assert not NonRetryableError("x").retryable
    assert HandlerError("x", retryable=False, error_class="Custom").error_class == "Custom"
    assert describe_failure(TargetRefused("refused: no")) == handlers.Failure(
        False, "TargetRefused", "refused: no"
    )
    assert describe_failure(ValueError("bad\n  value")) == handlers.Failure(True, "ValueError", "bad value")
    assert describe_failure(KeyError()).message == "KeyError"
    exited = HandlerExited(SystemExit(3))
    assert (str(exited), exited.error_class, exited.retryable) == (
        "the handler raised SystemExit(3)",
        "SystemExit",
        True,
    )
    assert str(HandlerExited(KeyboardInterrupt())) == "the handler raised KeyboardInterrupt"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class _UnprintableExit(SystemExit):
    def __str__(self) -> str:
        raise LookupError("no text")


class _TextOfItsOwn(str):
    def split(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a text that cannot be split")


class _OddText(Exception):
    def __str__(self) -> str:
        return _TextOfItsOwn("odd  text")


class _NoInit(NonRetryableError):
    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)  # ours never runs: no error_class on the instance


class _BadRetryable(NonRetryableError):
    @property
    def retryable(self) -> bool:  # type: ignore[override]
        raise RuntimeError("undecided")


def test_an_exception_whose_text_cannot_be_formatted_is_described_by_its_class() -> None:
    """Its __str__ is the handler's code: whatever it raises, the failure is still the handler's."""
    assert handlers.error_text(_Unprintable()) == (
        "_Unprintable (its message could not be formatted: RuntimeError)"
    )
    assert describe_failure(_Unprintable()) == handlers.Failure(
        True, "_Unprintable", "_Unprintable (its message could not be formatted: RuntimeError)"
    )
    assert str(HandlerExited(_UnprintableExit())) == (
        "the handler raised _UnprintableExit("
        "_UnprintableExit (its message could not be formatted: LookupError))"
    )
    # A str subclass's own methods never run.
    assert type(handlers.error_text(_OddText())) is str
    assert describe_failure(_OddText()).message == "odd text"


def test_a_handler_error_that_broke_its_classification_counts_as_an_unexpected_one() -> None:
    assert handlers.classify(_NoInit("x")) == (False, "_NoInit")
    assert handlers.classify(_BadRetryable("x")) == (True, "_BadRetryable")
    assert handlers.classify(HandlerError("x", retryable=False, error_class="Custom")) == (False, "Custom")
    assert handlers.classify(ValueError("x")) == (True, "ValueError")


def test_a_module_failing_on_import_keeps_the_secrets_of_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secret_handlers_mod.py").write_text(
        "raise RuntimeError('cannot reach postgresql://app:hunter22@db/app (password=hunter22)')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidRegistration) as invalid:
        HandlerRegistry(registered=["secret_handlers_mod"], entry_points=())
    assert str(invalid.value).endswith(
        "cannot import 'secret_handlers_mod': "
        "RuntimeError: cannot reach postgresql://app:***@db/app (password=***)"
    )


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # A module that parses the process's arguments at import (argparse) exits on the worker's.
        ("import sys\nsys.exit(0)\n", "SystemExit: 0 (the module called sys.exit while imported)"),
        ("import sys\nsys.exit('usage: tool [--x]')\n", "SystemExit: usage: tool [--x] (the module"),
        ("raise SystemExit\n", "SystemExit (the module called sys.exit while imported)"),
    ],
)
def test_a_module_that_exits_on_import_is_a_registration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, said: str
) -> None:
    """Not the worker's exit: a worker whose handler module ran sys.exit(0) at import exited 0
    before it ever started, saying nothing, and its supervisor took it for a clean stop."""
    (tmp_path / "exiting_handlers_mod.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidRegistration) as invalid:
        HandlerRegistry(registered=["exiting_handlers_mod"], entry_points=())
    assert f"cannot import 'exiting_handlers_mod': {said}" in str(invalid.value)


# --- which HTTP targets are refused --------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("172.31.255.255", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd12:3456::1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("100.64.0.1", "a carrier-grade NAT (100.64.0.0/10) address"),
        ("0.0.0.0", "an unspecified address"),
        ("0.1.2.3", "an unspecified address"),
        ("::", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("192.0.2.1", "a reserved address"),
        ("::ffff:127.0.0.1", "an IPv6 address embedding 127.0.0.1, a loopback address"),
        ("64:ff9b::a9fe:a9fe", "an IPv6 address embedding 169.254.169.254, a link-local address"),
        ("2002:a00:1::", "an IPv6 address embedding 10.0.0.1, a private address"),
        ("93.184.216.34", None),
        ("172.32.0.1", None),
        ("100.128.0.1", None),
        ("2606:2800:220:1:248:1893:25c8:1946", None),
        ("::ffff:93.184.216.34", None),
    ],
)
def test_address_classification(address: str, reason: str | None) -> None:
    assert classify_address(ipaddress.ip_address(address)) == reason


def test_allowlist_by_network_host_and_domain() -> None:
    policy = AddressPolicy.from_allowlist(["10.0.0.0/8", "127.0.0.1", " Internal.Example. ", "*.svc.local"])
    assert policy.refusal(ipaddress.ip_address("10.9.9.9")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:10.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.2")) == "a loopback address"
    assert policy.allows_host("internal.example")
    assert policy.allows_host("api.svc.local") and not policy.allows_host("svc.local.evil")
    assert not policy.allows_host("example")


def test_a_malformed_allowlist_network_stops_start_up() -> None:
    with pytest.raises(ValueError, match=r"SCHEDULER_HTTP_ALLOWLIST: '10\.0\.0\.0/33'"):
        HandlerRegistry(["10.0.0.0/33"])


def fixed_resolver(*answers: str) -> Any:
    async def resolve(host: str, port: int) -> Sequence[str]:
        return answers

    return resolve


def vet(policy: AddressPolicy, host: str, resolver: Any = resolve_host) -> list[str]:
    return [str(address) for address in asyncio.run(policy.vet(host, 80, resolver))]


def test_vet_checks_literal_and_resolved_addresses() -> None:
    empty = AddressPolicy()
    assert vet(empty, "93.184.216.34") == ["93.184.216.34"]
    assert vet(empty, "example.test", fixed_resolver("93.184.216.34")) == ["93.184.216.34"]
    with pytest.raises(TargetRefused, match=r"refused: 127\.0\.0\.1 is a loopback address \(allow-list it"):
        vet(empty, "127.0.0.1")
    with pytest.raises(TargetRefused, match=r"refused: \[?::1\]? is a loopback address"):
        vet(empty, "[::1]")
    # One private answer among public ones refuses the name: it would be a way in.
    with pytest.raises(TargetRefused, match=r"rebind\.test resolves to 10\.0\.0\.1, a private address"):
        vet(empty, "rebind.test", fixed_resolver("93.184.216.34", "10.0.0.1"))
    assert vet(AddressPolicy.from_allowlist(["rebind.test"]), "rebind.test", fixed_resolver("10.0.0.1")) == [
        "10.0.0.1"
    ]


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f000001"])
def test_numeric_host_spellings_are_judged_by_what_they_resolve_to(host: str) -> None:
    # httpx treats these as names; the C resolver turns them into 127.0.0.1 without DNS.
    with pytest.raises(TargetRefused, match=r"127\.0\.0\.1, a loopback address"):
        vet(AddressPolicy(), host)


def test_dns_failure_is_retryable() -> None:
    async def broken(host: str, port: int) -> Sequence[str]:
        raise OSError("Temporary failure in name resolution")

    with pytest.raises(HandlerError) as failed:
        vet(AddressPolicy(), "flaky.test", broken)
    assert failed.value.retryable and failed.value.error_class == "DNSError"


# --- HTTP payloads -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {},
        {"url": 5},
        {"url": "ftp://example.test/file"},
        {"url": "file:///etc/passwd"},
        {"url": "http:///no-host"},
        {"url": "https://example.test", "method": "GET /x"},
        {"url": "https://example.test", "headers": {"X-Bad": "a\r\nInjected: 1"}},
        {"url": "https://example.test", "headers": {"Bad Name": "x"}},
        {"url": "https://example.test", "headers": {"X-Number": 1}},
        {"url": "https://example.test", "headers": ["x"]},
        {"url": "https://example.test", "timeout": 0},
        {"url": "https://example.test", "timeout": "30"},
    ],
)
def test_a_bad_http_payload_is_not_retried(payload: Any) -> None:
    with pytest.raises(NonRetryableError):
        HttpRequest.from_payload(payload)


SECRET = "s3cr3t-V4LUE"


@pytest.mark.parametrize(
    ("ref", "payload"),
    [
        ("builtin:sleep", {"seconds": SECRET}),
        ("builtin:sleep", {"other": SECRET}),
        ("builtin:sleep", SECRET),
        ("builtin:sleep", {"seconds": -7.25}),
        ("builtin:fail", SECRET),
        ("builtin:fail", [SECRET]),
        ("builtin:fail", {"times": SECRET}),
        ("builtin:fail", {"times": -7.25}),
        ("builtin:fail", {"times": -725}),
        ("builtin:fail", {"times": 1, "retryable": SECRET}),
    ],
)
def test_builtin_errors_describe_the_payload_never_its_values(
    registry: HandlerRegistry, ref: str, payload: Any
) -> None:
    # Errors are stored in the run, the dead letter and the "job dead" log line.
    with pytest.raises(NonRetryableError) as refused:
        run(registry, ref, payload)
    message = str(refused.value)
    assert SECRET not in message and "7.25" not in message and "725" not in message, message


@pytest.mark.parametrize(
    "payload",
    [
        SECRET,
        {"url": 5, "token": SECRET},
        {"url": SECRET},
        {"url": f"https://[{SECRET}]/"},
        {"url": f"https://example.test:{SECRET}/"},
        {"url": f"ftp://{SECRET}.test/file"},
        {"url": "https://example.test", "method": f"GET {SECRET}"},
        {"url": "https://example.test", "method": [SECRET]},
        {"url": "https://example.test", "headers": {"X-Token": f"{SECRET}\r\nInjected: 1"}},
        {"url": "https://example.test", "headers": {f"Bad {SECRET}": "x"}},
        {"url": "https://example.test", "headers": {"X-Number": 725}},
        {"url": "https://example.test", "headers": [SECRET]},
        {"url": "https://example.test", "timeout": SECRET},
        {"url": "https://example.test", "timeout": -725},
    ],
)
def test_http_payload_errors_never_quote_its_values(payload: Any) -> None:
    with pytest.raises(NonRetryableError) as refused:
        HttpRequest.from_payload(payload)
    message = str(refused.value)
    assert SECRET not in message and SECRET.lower() not in message and "725" not in message, message


def test_http_payload_defaults_and_json_body() -> None:
    request = HttpRequest.from_payload(
        {"url": "https://example.test/hook", "method": "post", "body": {"a": 1}}
    )
    assert (request.method, request.timeout, request.content) == ("POST", 30.0, b'{"a":1}')
    assert request.headers["content-type"] == "application/json"
    plain = HttpRequest.from_payload({"url": "http://example.test", "body": "hi", "headers": {"X-A": "b"}})
    assert (plain.method, plain.content, plain.headers["x-a"]) == ("GET", b"hi", "b")
    assert "content-type" not in plain.headers
