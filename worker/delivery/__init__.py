"""Delivery: the dispatcher contract (base.py), one dispatcher per channel chosen from settings
(registry.py), one module per provider family, and what providers tell back (tracking, dead
addresses) and how fast they take sends (throttle)."""
