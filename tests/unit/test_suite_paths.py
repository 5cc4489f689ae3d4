"""Which runs of the suite bring the local stack up before the tests are handed out: not one given
only unit tests, which never need it."""

from __future__ import annotations

import pytest

from tests.conftest import UNIT_TESTS, unit_only


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["tests/unit"], True),
        ([str(UNIT_TESTS / "test_spec_limits.py") + "::test_x", "tests/unit/"], True),
        (["tests"], False),
        (["tests/unit", "tests/integration/test_cli_listen.py"], False),
        (["tests/unit_extra"], False),
        ([], False),
    ],
)
def test_only_paths_under_tests_unit_leave_the_stack_down(args: list[str], expected: bool) -> None:
    assert unit_only(args) is expected
