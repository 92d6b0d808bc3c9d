"""`make bench`: run every benchmark and print its figures.

Each module under bench/ exposes `main(argv: list[str]) -> None`. Pass names to run only some:
`make bench BENCH_ARGS="limiter"`. Options after `--` go to the benchmarks:
`make bench BENCH_ARGS="segments -- --users 270000000"`. `compare` (not run by default) runs
suites side by side with another commit: see bench/compare.py.
"""

import importlib
import os
import sys

import django

SUITES = [
    "limiter",
    "segments",
    "gate",
    "front_door",
    "ledger",
    "api",
    "bodies",
    "memory",
    "reports",
    "experiments",
    "plan",
    "backtest",
    "rounds",
    "erase",
    "stream",
    "chaos",
    "providers",
    "deliverability",
]


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatekeeper.settings")
    django.setup()
    names, extra = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    if names[:1] == ["compare"]:
        from bench import compare

        compare.main(extra)
        return
    for name in names or SUITES:
        if name not in SUITES:
            raise SystemExit(f"Unknown benchmark '{name}'. Choose from: {', '.join(SUITES)}.")
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"bench.{name}":
                raise
            continue
        print(f"\n=== {name} ===", flush=True)
        module.main(extra)


if __name__ == "__main__":
    main(sys.argv[1:])
