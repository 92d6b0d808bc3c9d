"""The bottom floor: code every app may import and that imports none of them.

Request bodies and their limits, the one rule for whole numbers, and (over time) the Redis
client, the API base view, permissions and id bounds. Nothing here knows segments, limits or
the worker; see docs/architecture.md.
"""
