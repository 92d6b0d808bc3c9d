"""Who may do what over the REST API.

Three rights, each an ordinary Django permission so admins grant them with groups:
- read lookups, quotas, segments, caps and snapshots: `segments.view_segment`;
- call the gate (check, release) and hand over send jobs: `limits.use_gate`;
- change segments, their lists and caps, build and roll back: `segments.change_segment` and
  `limits.change_cap` (the marketer's rights).
Superusers have all of them. Anonymous requests get 401, missing rights 403.
"""

import copy
import time
from typing import Any, ClassVar

from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

READ = ("segments.view_segment",)
GATE = ("limits.use_gate",)
EDIT = ("segments.change_segment", "limits.change_cap")


class _Needs(BasePermission):
    perms: tuple[str, ...] = ()
    message = "You do not have the right to do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perms(self.perms))


class CanRead(_Needs):
    perms = READ
    message = "Reading needs the segments.view_segment permission."


class CanGate(_Needs):
    perms = GATE
    message = "Calling the gate needs the limits.use_gate permission."


class CanEdit(_Needs):
    perms = EDIT
    message = "Changing segments and caps needs the marketer's permissions."


class ReadOrEdit(BasePermission):
    """Safe methods need READ, others EDIT."""

    def has_permission(self, request: Request, view: Any) -> bool:
        needed = CanRead() if request.method in ("GET", "HEAD", "OPTIONS") else CanEdit()
        self.message = needed.message
        return needed.has_permission(request, view)


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
