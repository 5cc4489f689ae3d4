"""Registering ``module:function``: what the lookup of the function may raise besides AttributeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.worker.handlers import HandlerRegistry, InvalidRegistration


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # A module offering its handlers lazily (PEP 562), importing an optional dependency on first use.
        (
            "def __getattr__(name):\n"
            "    raise ImportError('optional driver missing for postgresql://app:hunter22@db/app')\n",
            "ImportError",
        ),
        # An object whose attribute is a property that cannot be read yet (no configuration at import).
        (
            "class Jobs:\n"
            "    @property\n"
            "    def run(self):\n"
            "        raise RuntimeError('no config: password=hunter22')\n"
            "jobs = Jobs()\n",
            "RuntimeError",
        ),
    ],
)
def test_a_function_whose_lookup_raises_is_a_registration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, said: str
) -> None:
    """A registration whose import succeeds but whose attribute lookup raises anything other than
    AttributeError (a module's lazy ``__getattr__`` importing an optional dependency, a property of
    an object) escapes ``HandlerRegistry._register`` as that exception: ``_walk`` catches only
    AttributeError, and the worker's CLI (``except ValueError``) prints a traceback where an import
    failing the same way is one redacted line, exit 2. The exception's text, unredacted, may carry
    the password the import-error fix (f5f6123) keeps out of that line."""
    module = "lazy_property_handlers_mod" if "Jobs" in body else "lazy_getattr_handlers_mod"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = f"{module}:jobs.run" if "Jobs" in body else f"{module}:run"
    with pytest.raises(InvalidRegistration) as invalid:
        HandlerRegistry(registered=[entry], entry_points=())
    message = str(invalid.value)
    assert message.startswith(f"handler registration {entry!r} (SCHEDULER_HANDLERS or --handler): ")
    assert said in message and "\n" not in message and "hunter22" not in message
