"""The committed generated code is what ``proto/scheduler/v1/scheduler.proto`` generates (``make proto``),
and the API serves every RPC the definition declares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scheduler.api.routes import ROUTES
from scheduler.api.service import METHODS
from scheduler.v1 import scheduler_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("scheduler_pb2.py", "scheduler_pb2.pyi", "scheduler_pb2_grpc.py")


def test_the_committed_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"),
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            str(ROOT / "proto/scheduler/v1/scheduler.proto"),
        ],
        check=True,
    )  # fmt: skip
    for name in GENERATED:
        fresh = (tmp_path / "scheduler/v1" / name).read_text()
        committed = (ROOT / "scheduler/v1" / name).read_text()
        assert committed == fresh, f"scheduler/v1/{name} is stale: run `make proto`"


def test_every_rpc_is_served_with_its_messages_and_has_an_http_route() -> None:
    service = pb.DESCRIPTOR.services_by_name["SchedulerService"]
    declared = {method.name: method for method in service.methods}
    assert set(METHODS) == set(declared)
    for name, method in METHODS.items():
        assert method.request.DESCRIPTOR.full_name == declared[name].input_type.full_name
        assert method.response.DESCRIPTOR.full_name == declared[name].output_type.full_name
    assert {route.method for route in ROUTES} == set(declared)
