"""manage.py limiter_functions [--drop-others [--force]]: the limiter's function libraries on
every Redis primary, one per release whose Lua differs, and dropping those of other releases.
docs/limiter.md, "The function library across releases", says when."""

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis
from gatekeeper.lib.words import count
from limits.engine.transport import LIBRARY_BASE, LIMITER_LIBRARY, libraries_loaded
from limits.engine.upkeep import primaries
from worker.processes import other_releases_refusal


def _release(name: str) -> str:
    if name == LIMITER_LIBRARY.name:
        return "this release"
    if name == LIBRARY_BASE:
        return "a release before versioned names"
    return "another release"


class Command(BaseCommand):
    help = (
        "List the limiter's Redis function libraries on every primary (one per release whose "
        "Lua differs); with --drop-others, delete those of other releases."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--drop-others",
            action="store_true",
            help="delete the libraries of other releases; refused while the process registry "
            "shows a process of another release",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="with --drop-others: drop them even so (a process of another release still "
            "running loads its library back on its next call)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["force"] and not options["drop_others"]:
            raise CommandError("--force goes with --drop-others.")
        current = LIMITER_LIBRARY.name
        try:
            nodes = [(node, conn, libraries_loaded(conn)) for node, conn in primaries(get_redis())]
            others = [
                (node, conn, name)
                for node, conn, found in nodes
                for name in found
                if name != current
            ]
            self.stdout.write(f"This release's library: {current}.")
            for node, _, found in nodes:
                if current not in found:
                    self.stdout.write(f"{node}: {current} not loaded (its first call loads it)")
                for name, functions in sorted(found.items()):
                    self.stdout.write(
                        f"{node}: {name}, {count(len(functions), 'function')} ({_release(name)})"
                    )
            if not others:
                self.stdout.write(self.style.SUCCESS("No library of another release is loaded."))
                return
            if not options["drop_others"]:
                self.stdout.write(
                    f"{count(len(others), 'library', 'libraries')} of other releases: "
                    "--drop-others deletes them once no process of theirs runs."
                )
                return
            refusal = other_releases_refusal(
                "Not dropped",
                "a process still running loads its library back on its next call",
            )
            if refusal and not options["force"]:
                raise CommandError(refusal)
            dropped = 0
            for node, conn, name in others:
                try:
                    conn.function_delete(name)
                except redis.exceptions.ResponseError as exc:
                    if "library not found" not in str(exc).lower():
                        raise
                    self.stdout.write(f"{node}: {name} was already gone")
                    continue
                dropped += 1
                self.stdout.write(f"{node}: dropped {name}")
        except REDIS_DOWN as exc:
            raise CommandError(
                f"Redis failed ({type(exc).__name__}: {exc}). What was dropped stays "
                "dropped; run it again."
            ) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Dropped {count(dropped, 'library', 'libraries')} of other releases on "
                f"{count(len({node for node, _, _ in others}), 'node')}; {current} stays."
            )
        )
