"""The tier rules (tests/tiers.py) put each kind of slow test in the slow tier and leave the
in-memory and HTTP variants of the same tests in the fast one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from tiers import is_slow


@dataclass
class Item:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)
    marked: bool = False

    def get_closest_marker(self, name: str) -> object:
        return object() if self.marked and name == "slow" else None


@pytest.mark.parametrize(
    "item",
    [
        Item("tests/store/test_x.py::test_y", ["redis_cluster_url"]),
        Item("tests/store/test_x.py::test_y", ["fresh_tls_sentinel"]),
        Item("tests/durable/test_temporal_durable.py::test_y"),
        Item("tests/examples/test_examples.py::test_y[a.py]"),
        Item("tests/frameworks/test_f.py::test_y[stdio]"),
        Item("tests/frameworks/test_f.py::test_y[http]", ["redis_url"]),
        Item("tests/store/test_model.py::test_backend_matches_the_reference_model[sqlite]"),
        Item("tests/store/test_contract.py::test_y[redis-cluster-trio]"),
        Item("tests/store/test_contract.py::test_exactly_one_of_four_processes_claims[sqlite]"),
        Item("tests/cli/test_keys.py::test_the_console_script_lists[redis]"),
        Item("tests/server/test_x.py::test_y", marked=True),
    ],
)
def test_slow_kinds_are_in_the_slow_tier(item: Item) -> None:
    assert is_slow(item)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "item",
    [
        Item("tests/frameworks/test_f.py::test_y[memory]", ["redis_url"]),
        Item("tests/store/test_model.py::test_backend_matches_the_reference_model[memory]"),
        Item("tests/store/test_contract.py::test_y[redis-trio]"),
        Item("tests/cli/test_demo.py::test_default_run_over_memory_and_the_killed_pipelines"),
        Item("tests/server/test_x.py::test_a_stdio_like_name_is_not_a_parameter"),
    ],
)
def test_the_rest_is_in_the_fast_tier(item: Item) -> None:
    assert not is_slow(item)  # type: ignore[arg-type]
