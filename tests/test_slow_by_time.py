"""tests/slow_by_time.txt and scripts/slow_by_time.py: the tests the fast path leaves to the whole suite for their
time alone are read from a run's ``--durations`` lines, listed over the bound, and marked ``slow`` as collected."""

from __future__ import annotations

import re

import pytest

from scripts import slow_by_time
from tests.helpers import ROOT

OUTPUT = """\
============================= slowest durations ==============================
12.50s call     tests/test_quickstart.py::test_quickstart_on_three_items_then_all_cache_hits
0.60s setup    tests/test_quickstart.py::test_quickstart_on_three_items_then_all_cache_hits
1.20s call     tests/providers/test_x.py::test_case[openai SDK-trickle]@group
0.90s teardown tests/providers/test_x.py::test_case[openai SDK-trickle]@group
1.90s call     tests/a.py::test_under
====== 3 passed in 20.01s ======
"""


def test_a_tests_time_is_its_set_up_call_and_tear_down_without_its_group() -> None:
    times = slow_by_time.seconds_per_test(OUTPUT)
    assert times == {
        "tests/test_quickstart.py::test_quickstart_on_three_items_then_all_cache_hits": pytest.approx(13.1),
        "tests/providers/test_x.py::test_case[openai SDK-trickle]": pytest.approx(2.1),
        "tests/a.py::test_under": pytest.approx(1.9),
    }


def test_the_list_names_the_tests_over_the_bound_longest_first_and_reads_back(tmp_path) -> None:
    text = slow_by_time.render(slow_by_time.seconds_per_test(OUTPUT), 2.0)
    rows = [line for line in text.splitlines() if not line.startswith("#")]
    assert rows == ["  13.1  tests/test_quickstart.py::test_quickstart_on_three_items_then_all_cache_hits",
                    "   2.1  tests/providers/test_x.py::test_case[openai SDK-trickle]"]
    path = tmp_path / "list.txt"
    path.write_text(text, encoding="utf-8")
    assert slow_by_time.listed(path) == {"tests/test_quickstart.py::test_quickstart_on_three_items_then_all_cache_hits",
                                         "tests/providers/test_x.py::test_case[openai SDK-trickle]"}


def test_every_listed_test_is_still_there() -> None:
    """A test renamed or removed leaves its line behind: the list names only tests that exist (their module and
    function; a parametrized case's id is checked by the run that writes the list)."""
    for test in sorted(slow_by_time.listed()):
        module, _, name = test.partition("::")
        function = re.sub(r"\[.*$", "", name)
        source = (ROOT / module).read_text(encoding="utf-8") if (ROOT / module).exists() else ""
        assert f"def {function}(" in source, f"tests/slow_by_time.txt names {test}, which is not there any more"


def test_a_listed_test_is_marked_slow(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py marks what the list names as it is collected (``-m "not slow"`` then leaves it out)."""
    from tests import conftest

    assert slow_by_time.listed(), "the list is empty"
    listed = conftest.SLOW_BY_TIME  # (empty where RUNNER_TEST_SLOW_BY_TIME=0: scripts/slow_by_time.py's run)
    session_items = {re.sub(r"@\w+$", "", item.nodeid): item for item in request.session.items}
    present = [session_items[test] for test in listed if test in session_items]
    # this process collected every test (only its own share runs here), or -m / -k left the listed ones out
    config = request.config
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr \
            and not config.option.keyword:
        assert len(present) == len(listed), sorted(listed - set(session_items))[:5]
    for item in present:
        assert item.get_closest_marker("slow") is not None, item.nodeid
