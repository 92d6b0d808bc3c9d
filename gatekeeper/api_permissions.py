"""Who may do what over the REST API.

Three rights, each an ordinary Django permission so admins grant them with groups:
- read lookups, quotas, segments, caps and snapshots: `segments.view_segment`;
- call the gate (check, release) and hand over send jobs: `limits.use_gate`;
- change segments, their lists and caps, build and roll back: `segments.change_segment` and
  `limits.change_cap` (the marketer's rights).
Superusers have all of them. Anonymous requests get 401, missing rights 403.
"""

from typing import Any

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
