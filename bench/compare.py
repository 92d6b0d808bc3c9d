"""`make bench BENCH_ARGS="compare -- --base REV"`: the benchmarks of this checkout side by side
with those of another commit, on the same machine in the same minutes.

The other commit is checked out once under var/compare/<sha> (a git worktree sharing this
checkout's virtualenv). Each round runs every chosen suite in both checkouts, alternating which
goes first, so that a machine that slows down or speeds up during the run weighs on both sides.
Every figure a suite prints is read from its line: lines that read the same once their numbers are
taken out are the same figure, and each figure's median over the rounds is printed for both
checkouts with their ratio (this checkout over the other). Whether a ratio above 1 is better
depends on the figure (decisions/s: yes; microseconds: no): the line says which it is.

Options after a second `--` go to the suites:
`make bench BENCH_ARGS="compare -- --base HEAD~3 --suites limiter -- --quick"`.
"""

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# What processes a suite starts print about themselves (Celery's banner, its pids): not figures.
NOT_A_FIGURE = re.compile(r"^\s*[-*\[]|celery@|\.> ")


def template(line: str) -> str:
    """A line with its numbers taken out (and its padding): what makes two runs' lines the same
    figure."""
    return " ".join(NUMBER.sub("#", line).split())


def numbers(line: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUMBER.findall(line)]


def checkout(base: str) -> Path:
    """A worktree of `base` under var/compare/, made once, sharing this checkout's .venv."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{base}^{{commit}}"],
        cwd=HERE, capture_output=True, text=True,
    )  # fmt: skip
    if sha.returncode != 0:
        raise SystemExit(f"--base: '{base}' is not a commit of this repository.")
    path = HERE / "var" / "compare" / sha.stdout.strip()[:12]
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), sha.stdout.strip()],
            cwd=HERE, check=True, capture_output=True,
        )  # fmt: skip
    venv = path / ".venv"
    if not venv.exists():
        venv.symlink_to(HERE / ".venv")
    return path


def run(where: Path, suite: str, extra: list[str]) -> list[str]:
    """One suite's printed lines, run in `where` with this virtualenv's Python."""
    command = [sys.executable, "-m", "bench", suite, *(["--", *extra] if extra else [])]
    done = subprocess.run(command, cwd=where, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"bench {suite} failed in {where} (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return [
        line
        for line in done.stdout.splitlines()
        if NUMBER.search(line) and not NOT_A_FIGURE.search(line)
    ]


def collect(into: dict[str, list[list[float]]], order: list[str], lines: list[str]) -> None:
    seen: dict[str, int] = defaultdict(int)
    for line in lines:
        key = template(line)
        seen[key] += 1
        if seen[key] > 1:  # the same words twice in one run: keep them apart
            key = f"{key}  [{seen[key]}]"
        if key not in order:
            order.append(key)
        into[key].append(numbers(line))


def medians(runs: list[list[float]]) -> list[float]:
    width = min(len(r) for r in runs)
    return [statistics.median(r[i] for r in runs) for i in range(width)]


def fill(key: str, values: list[float]) -> str:
    parts = key.split("#")
    out = parts[0]
    for i, part in enumerate(parts[1:]):
        value = values[i] if i < len(values) else float("nan")
        out += (f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}") + part
    return out


def report(order: list[str], head: dict, base: dict, name: str) -> None:
    print(f"\n--- {name}: medians of {len(next(iter(head.values()), []))} rounds ---")
    for key in order:
        if key not in head or key not in base:
            side = "this checkout" if key in head else "the base"
            print(f"  (only in {side}) {key}")
            continue
        now, before = medians(head[key]), medians(base[key])
        print(f"  now:    {fill(key, now)}")
        print(f"  before: {fill(key, before)}")
        ratios = [f"{a / b:.2f}x" if b else "-" for a, b in zip(now, before, strict=False)]
        print(f"  ratios now/before, figure by figure: {' '.join(ratios)}")


def main(argv: list[str]) -> None:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(prog="bench compare")
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suites", default="gate,limiter,api", help="comma-separated suites")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds: at least 1.")
    other = checkout(args.base)
    print(f"this checkout: {HERE}\nbase {args.base}: {other}")
    for suite in args.suites.split(","):
        head: dict[str, list[list[float]]] = defaultdict(list)
        base: dict[str, list[list[float]]] = defaultdict(list)
        order: list[str] = []
        for round_ in range(args.rounds):
            sides = [(HERE, head), (other, base)]
            for where, into in sides if round_ % 2 == 0 else sides[::-1]:
                started = time.monotonic()
                collect(into, order, run(where, suite, extra))
                label = "this checkout" if where == HERE else "base"
                print(
                    f"  {suite} round {round_ + 1}/{args.rounds}, {label}: "
                    f"{time.monotonic() - started:.0f} s",
                    flush=True,
                )
        report(order, head, base, suite)
