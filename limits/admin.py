"""The limits app's admin, each kind's in its wing: caps (with their history and quota resets),
cap rules, quiet hours, topics and the global control group (limits/policy/admin/, whose `base`
holds what every kind's admin shares), cap experiments (limits/studies/admin.py), the suppression
list (limits/people/admin.py), erasures (limits/privacy/admin.py) and the event stream's webhook
endpoints (limits/stream/admin.py). Importing this module registers them all with the admin
site."""

from limits.people import admin as suppressions
from limits.policy.admin import caps, holdout, quiet, rules, topics
from limits.privacy import admin as erasures
from limits.stream import admin as webhooks
from limits.studies import admin as experiments

__all__ = [
    "caps", "erasures", "experiments", "holdout", "quiet", "rules", "suppressions", "topics",
    "webhooks",
]  # fmt: skip
