"""The segments app's console pages: snapshots (the one "Build and publish" button, the
versions, a confirmed "make live"), and the build progress the build page polls."""

from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, reverse

from gatekeeper.lib.console import ConsoleLink, page, render, require
from segments.index import SnapshotError, index_status
from segments.models import Build
from segments.publishing import BuildBusy, BuildInProgress, snapshot_rollback
from segments.selectors import build_active, snapshot_versions
from segments.services import build_start
from segments.store import StoreError

LINKS = [
    ConsoleLink(
        "Snapshots",
        "snapshots",
        "segments.view_build",
        "Build and publish; the versions, and which is live.",
    ),
]


def urls(site: AdminSite) -> list[URLPattern]:
    return [
        page(site, "snapshots/", snapshots, "snapshots"),
        page(site, "snapshots/build/", snapshot_build, "snapshot_build"),
        page(site, "snapshots/<str:version>/make-live/", snapshot_make_live, "snapshot_make_live"),
        page(site, "segments/build/<int:build_id>/progress/", build_progress, "build_progress"),
    ]


def _segments_text(entry: dict[str, Any]) -> str:
    return ", ".join(
        f"{slug}: {count:,}" for slug, count in entry["segments"].items() if count is not None
    )


def snapshots(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, "segments.view_build")
    try:
        versions = snapshot_versions()
        problem = ""
    except StoreError as exc:
        versions, problem = [], f"The snapshot store is not answering: {exc}"
    builds = {b.version: b for b in Build.objects.exclude(version="")}
    for entry in versions:
        entry["build"] = builds.get(entry["version"])
        entry["segments_text"] = _segments_text(entry)
    return render(
        request,
        site,
        "snapshots.html",
        "Snapshots",
        versions=versions,
        problem=problem,
        running=build_active(),
        can_publish=request.user.has_perm("segments.publish_snapshot"),
        loaded=index_status(),
    )


def snapshot_build(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, "segments.publish_snapshot")
    if request.method != "POST":
        return HttpResponseRedirect(reverse("admin:snapshots"))
    try:
        build = build_start(user=request.user)
    except BuildInProgress as exc:
        messages.warning(request, str(exc))
        return HttpResponseRedirect(reverse("admin:snapshots"))
    messages.success(request, f"Build #{build.pk} started.")
    return HttpResponseRedirect(reverse("admin:segments_build_change", args=[build.pk]))


def snapshot_make_live(request: HttpRequest, *, site: AdminSite, version: str) -> HttpResponse:
    require(request, "segments.publish_snapshot")
    try:
        versions = {v["version"]: v for v in snapshot_versions()}
    except StoreError as exc:
        messages.error(request, f"The snapshot store is not answering: {exc}")
        return HttpResponseRedirect(reverse("admin:snapshots"))
    entry = versions.get(version)
    if entry is None:
        messages.error(request, f"There is no snapshot version '{version}'.")
        return HttpResponseRedirect(reverse("admin:snapshots"))
    live = next((v for v in versions.values() if v["is_live"]), None)
    entry["segments_text"] = _segments_text(entry)
    if request.method == "POST":
        # In the REST API's words (segments/api.py, SnapshotActivateView): an incomplete or
        # corrupt version says what is wrong with it, a store that does not answer says so.
        try:
            snapshot_rollback(version=version)
        except (BuildInProgress, BuildBusy) as exc:
            messages.warning(request, f"{version} was not made live: {exc}")
        except SnapshotError as exc:
            messages.error(request, f"{version} was not made live: {exc}")
        except StoreError as exc:
            messages.error(
                request, f"{version} was not made live: the snapshot store is unreachable: {exc}"
            )
        except Exception as exc:
            messages.error(request, f"{version} was not made live: {exc}")
        else:
            messages.success(
                request,
                f"{version} is live. Every process switches to it at its next poll "
                "(within seconds); the dashboard shows which have.",
            )
        return HttpResponseRedirect(reverse("admin:snapshots"))
    return render(
        request,
        site,
        "snapshot_confirm.html",
        "Make a snapshot live",
        entry=entry,
        live=live,
        running=build_active(),
    )


def build_progress(request: HttpRequest, *, site: AdminSite, build_id: int) -> JsonResponse:
    require(request, "segments.view_build")
    build = get_object_or_404(Build, pk=build_id)
    return JsonResponse(
        {
            "id": build.pk,
            "status": build.state,
            "progress": build.progress,
            "stage": build.stage,
            "version": build.version,
            "error": build.error,
            "done": not build.is_alive(),
        }
    )
