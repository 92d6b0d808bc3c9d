"""A clock in milliseconds that moves only when the code under test waits (worker/throttle.py's
`clock` and `sleep`), so rate tests pass time in instead of sleeping through it."""


class Clock:
    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms
        self.waits: list[float] = []  # seconds, as asked

    def __call__(self) -> int:
        return self.ms

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.ms += round(seconds * 1000)
