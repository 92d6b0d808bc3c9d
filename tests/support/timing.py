"""Where the suite's time goes: at the end of a run, the time per test file (setup, call and
teardown of its tests; a shared fixture's start-up counts in the file of the first test that asks
for it) beside pytest's own `--durations` list of the slowest tests. `make check` and `make test`
print both (docs/testing.md)."""

from collections import defaultdict

import pytest

FILES_SHOWN = 25

_per_file: dict[str, float] = defaultdict(float)
_tests_per_file: dict[str, set[str]] = defaultdict(set)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _per_file[path] += report.duration
    _tests_per_file[path].add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _per_file:
        return
    total = sum(_per_file.values())
    slowest = sorted(_per_file.items(), key=lambda item: item[1], reverse=True)[:FILES_SHOWN]
    terminalreporter.write_sep("=", f"time per test file (the {len(slowest)} slowest)")
    for path, seconds in slowest:
        share = 100 * seconds / total if total else 0
        terminalreporter.write_line(
            f"{seconds:8.1f}s {share:5.1f}%  {len(_tests_per_file[path]):4d} tests  {path}"
        )
    terminalreporter.write_line(
        f"{total:8.1f}s in {sum(len(t) for t in _tests_per_file.values())} tests "
        f"of {len(_per_file)} files"
    )
