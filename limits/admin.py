"""The limits app's admin, a module per kind: caps (with quota resets), cap rules, quiet hours,
topics, the global control group, cap experiments, the one history of every setting, the
suppression list, erasures and the event stream's webhook endpoints; `base` holds what they
share. Importing the package registers them all with the admin site."""

from limits.people import admin as suppressions
from limits.policy.admin import caps, history, holdout, quiet, rules, topics
from limits.privacy import admin as erasures
from limits.stream import admin as webhooks
from limits.studies import admin as experiments

__all__ = [
    "caps", "erasures", "experiments", "history", "holdout", "quiet", "rules", "suppressions",
    "topics", "webhooks",
]  # fmt: skip
