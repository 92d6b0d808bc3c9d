"""The limits app's admin, each kind's in its wing: caps (with quota resets), cap rules, quiet
hours, topics, the global control group and the one history of every setting
(limits/policy/admin/, whose `base` holds what every kind's admin shares), cap experiments
(limits/studies/admin.py), the suppression list (limits/people/admin.py), erasures
(limits/privacy/admin.py) and the event stream's webhook endpoints (limits/stream/admin.py).
Importing this module registers them all with the admin site."""

from limits.people import admin as suppressions
from limits.policy.admin import caps, history, holdout, quiet, rules, topics
from limits.privacy import admin as erasures
from limits.stream import admin as webhooks
from limits.studies import admin as experiments

__all__ = [
    "caps", "erasures", "experiments", "history", "holdout", "quiet", "rules", "suppressions",
    "topics", "webhooks",
]  # fmt: skip
