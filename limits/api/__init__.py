"""The limits app's REST views, a module per kind: caps, rules and quiet hours, the suppression
list, a user's quota (the ledger's views are limits/ledger/api.py)."""
