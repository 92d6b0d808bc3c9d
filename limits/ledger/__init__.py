"""The send ledger: every gate decision kept durably (stream.py appends, drain.py writes the
database), a user's history, the decisions report and the rebuild of Redis's logs from it."""
