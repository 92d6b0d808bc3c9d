"""Who may do what: one model of rights for the REST API and the admin.

Every right is an ordinary Django permission, granted through the Marketer and Viewer groups
(gatekeeper/lib/groups.py) or to a user directly. A REST view names, per HTTP method, the
permissions it needs (`rights`), and the admin page doing the same thing checks the same ones,
so a user can do over REST exactly what they can do in the admin (docs/api.md, "Rights").
Superusers have every right. Anonymous requests get 401, missing rights 403.
"""

import copy
import time
from typing import Any, ClassVar

from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

# Reading, per resource (the model's view permission, as in the admin).
VIEW_SEGMENTS = ("segments.view_segment",)
VIEW_USER_LISTS = ("segments.view_segment", "segments.view_userlist")
VIEW_BUILDS = ("segments.view_build",)
VIEW_CAPS = ("limits.view_cap",)
VIEW_RULES = ("limits.view_rule",)
VIEW_QUIET_HOURS = ("limits.view_quiethours",)
VIEW_TOPICS = ("limits.view_topic",)
VIEW_PREFERENCES = ("limits.view_preference",)
VIEW_HOLDOUT = ("limits.view_holdout",)
VIEW_EXPERIMENTS = ("limits.view_experiment",)
VIEW_SEND_JOBS = ("worker.view_sendjob",)
VIEW_BACKTESTS = ("worker.view_backtest",)
VIEW_SUPPRESSIONS = ("limits.view_suppression",)
# The decisions report (REST) does what the dashboard's chart of refused sends and its CSV
# download do: the dashboard's right (the dashboard already shows decisions by segment and reason).
VIEW_REPORTS = ("segments.view_segment",)
# Writing.
ADD_SEGMENTS = ("segments.add_segment",)
CHANGE_SEGMENTS = ("segments.change_segment",)
# As in the admin, deleting a segment deletes its lists, caps, rules and quiet hours, so it needs
# their rights.
DELETE_SEGMENTS = (
    "segments.delete_segment",
    "segments.delete_userlist",
    "limits.delete_cap",
    "limits.delete_rule",
    "limits.delete_quiethours",
)
# As in the admin, where a list is uploaded on the segment's form.
REPLACE_USER_LISTS = (
    "segments.change_segment",
    "segments.add_userlist",
    "segments.delete_userlist",
)
SET_CAPS = ("limits.add_cap", "limits.change_cap")
ADD_RULES = ("limits.add_rule",)
# A backtest changes nothing, but it replays the ledger: those who may draft rules may run one.
RUN_BACKTESTS = ("worker.add_backtest",)
CHANGE_RULES = ("limits.change_rule",)
DELETE_RULES = ("limits.delete_rule",)
ADD_QUIET_HOURS = ("limits.add_quiethours",)
CHANGE_QUIET_HOURS = ("limits.change_quiethours",)
DELETE_QUIET_HOURS = ("limits.delete_quiethours",)
ADD_TOPICS = ("limits.add_topic",)
CHANGE_TOPICS = ("limits.change_topic",)
CHANGE_HOLDOUT = ("limits.change_holdout",)
ADD_EXPERIMENTS = ("limits.add_experiment",)
# Stopping and concluding too; concluding also writes the segment's rules.
CHANGE_EXPERIMENTS = ("limits.change_experiment",)
CONCLUDE_EXPERIMENTS = ("limits.change_experiment", "limits.add_rule", "limits.change_rule")
DELETE_TOPICS = ("limits.delete_topic",)
# A person's preferences: set for them by a campaign system (its own preference centre, an
# import from another tool) or by a marketer in the admin.
CHANGE_PREFERENCES = ("limits.change_preference",)
# The suppression list: adding (an import too) and taking users off it.
ADD_SUPPRESSIONS = ("limits.add_suppression",)
DELETE_SUPPRESSIONS = ("limits.delete_suppression",)
PUBLISH = ("segments.publish_snapshot",)
RESET_QUOTA = ("limits.reset_quota",)
# Handing a campaign file to the worker from the admin (marketers).
SEND_CAMPAIGNS = ("worker.add_sendjob",)
# Cancelling a send job's waiting sends (deferred by the gate): marketers and campaign systems.
CANCEL_SENDS = ("worker.cancel_sendjob",)
# A person's export (everything held about them): whoever may read each place of it.
EXPORT_PERSONAL_DATA = (
    "limits.view_cap",
    "limits.view_suppression",
    "limits.view_preference",
    "worker.view_sendjob",
)
# Erasing people everywhere, and reading how an erasure goes (a privacy officer's or tool's).
ERASE_USERS = ("limits.erase_users",)
VIEW_ERASURES = ("limits.view_erasure",)
# Pulling the event stream (a warehouse loader's account): every person's decisions and changes.
READ_STREAM = ("limits.read_stream",)
# The stream's webhook endpoints (their secrets with them: who reads one verifies its requests).
VIEW_WEBHOOKS = ("limits.view_webhookendpoint",)
ADD_WEBHOOKS = ("limits.add_webhookendpoint",)
CHANGE_WEBHOOKS = ("limits.change_webhookendpoint",)
DELETE_WEBHOOKS = ("limits.delete_webhookendpoint",)
# Deliverability: the mailbox providers (their domains and rates; resuming one its brake
# paused is a change of it) and the sending domains' warm-up plans.
VIEW_MAILBOX_PROVIDERS = ("worker.view_mailboxprovider",)
ADD_MAILBOX_PROVIDERS = ("worker.add_mailboxprovider",)
CHANGE_MAILBOX_PROVIDERS = ("worker.change_mailboxprovider",)
DELETE_MAILBOX_PROVIDERS = ("worker.delete_mailboxprovider",)
VIEW_WARMUPS = ("worker.view_warmupplan",)
ADD_WARMUPS = ("worker.add_warmupplan",)
CHANGE_WARMUPS = ("worker.change_warmupplan",)
DELETE_WARMUPS = ("worker.delete_warmupplan",)
# Calling the gate and handing over send jobs (campaign systems).
GATE = ("limits.use_gate",)
# Posting outcome events (conversions) for the experiments report: the company's systems.
POST_EVENTS = ("limits.add_studyevent",)
# The experiments report, as the experiments themselves.
VIEW_STUDIES = ("limits.view_experiment",)
# What a campaign system's account needs: the gate and send jobs, and reading segments, quotas,
# the rules and quiet hours its refusals come from, the topics its sends name, and its jobs'
# progress; and keeping the suppression list and people's preferences (opt-outs, opt-ins and
# choices from its own preference centre).
CAMPAIGN_SYSTEM = (
    *GATE,
    *VIEW_SEGMENTS,
    *VIEW_CAPS,
    *VIEW_RULES,
    *VIEW_QUIET_HOURS,
    *VIEW_TOPICS,
    *VIEW_PREFERENCES,
    *CHANGE_PREFERENCES,
    *VIEW_SEND_JOBS,
    *CANCEL_SENDS,
    *VIEW_SUPPRESSIONS,
    *ADD_SUPPRESSIONS,
    *DELETE_SUPPRESSIONS,
    *POST_EVENTS,
)


class HasRights(BasePermission):
    """The view's `rights[<method>]` permissions, all of them (HEAD and OPTIONS as GET)."""

    message = "You do not have the right to do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        method = "GET" if request.method in ("HEAD", "OPTIONS") else str(request.method)
        needed: tuple[str, ...] | None = getattr(view, "rights", {}).get(method)
        if needed is None:
            # A method the view does not handle gets its 405; one it handles without naming
            # its rights is refused rather than left open.
            return not hasattr(view, method.lower())
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if not user.has_perms(needed):
            self.message = (
                f"This needs the permission{'s' if len(needed) > 1 else ''} {', '.join(needed)}."
            )
            return False
        return True


class CachedTokenAuthentication(TokenAuthentication):
    """Token authentication that remembers a token's user for a few seconds, per process.

    On the hot endpoints (gate check, lookups) the token's database query was 40% of the time
    Django spends on a one-request check. The price: a revoked token, a deactivated user or a
    changed permission takes up to TOKEN_CACHE_SECONDS to take effect in each process.
    """

    TOKEN_CACHE_SECONDS = 10.0
    MAX_TOKENS = 10_000

    _cache: ClassVar[dict[str, tuple[Any, Any, float]]] = {}

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[2] > now:
            # A copy per request: the view may set attributes on request.user.
            return copy.copy(hit[0]), hit[1]
        user, token = super().authenticate_credentials(key)
        # Filled now, on the instance every copy shares: no permission queries until expiry.
        user.get_all_permissions()
        if len(self._cache) >= self.MAX_TOKENS:
            self._cache.clear()  # rare: many distinct tokens; simpler than an LRU
        self._cache[key] = (user, token, now + self.TOKEN_CACHE_SECONDS)
        return user, token


# Every API view's (through JsonAPIView). Token first: its WWW-Authenticate header is what
# makes an anonymous request a 401, not a 403.
API_AUTHENTICATION = [CachedTokenAuthentication, SessionAuthentication]
