"""A person's export as a file, and their erasure, from the console's
user lookup."""

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
)
from django.urls import reverse

from gatekeeper.lib.console import render, require
from gatekeeper.lib.permissions import ERASE_USERS, EXPORT_PERSONAL_DATA
from limits.people.pages import _known_id, _lookup_url
from limits.policy.quota import Unavailable
from limits.privacy.personal import person_export, places
from limits.privacy.services import erasure_start


def person_download(request: HttpRequest, *, site: AdminSite, user_id: int) -> HttpResponse:
    """Everything held about the person, as GET /api/v1/users/<id>/export/ answers it, as a
    file to hand them."""
    require(request, *EXPORT_PERSONAL_DATA)
    _known_id(user_id)
    try:
        document = person_export(user_id)
    except Unavailable as exc:
        messages.error(request, f"No export: {exc}")
        return HttpResponseRedirect(_lookup_url(user_id))
    response = JsonResponse(document, json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="user-{user_id}.json"'
    return response


def person_erase(request: HttpRequest, *, site: AdminSite, user_id: int) -> HttpResponse:
    """Erase the person everywhere, once confirmed (limits/privacy/erasure.py)."""
    require(request, *ERASE_USERS)
    _known_id(user_id)
    if request.method == "POST":
        erasure = erasure_start(user_ids=[user_id], via="admin", by=request.user)
        messages.success(
            request,
            f"Erasure {erasure.pk} started: the person is refused on every channel within "
            "seconds, and their data goes from every place within a minute.",
        )
        return HttpResponseRedirect(reverse("admin:limits_erasure_change", args=[erasure.pk]))
    return render(
        request,
        site,
        "person_erase_confirm.html",
        f"Erase user {user_id} everywhere",
        user_id=user_id,
        places=[place for place in places() if place.erase is not None],
        lookup=_lookup_url(user_id),
    )
