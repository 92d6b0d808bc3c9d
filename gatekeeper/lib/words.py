"""Counts in words, for what people read: "1 user", "2,000 users"."""


def count(number: int, one: str, many: str | None = None) -> str:
    return f"{number:,} {one if number == 1 else (many or one + 's')}"
