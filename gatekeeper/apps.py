from django.contrib.admin.apps import AdminConfig


class GatekeeperAdminConfig(AdminConfig):
    """Django's admin with Gatekeeper's site: the marketer's dashboard, user lookup, what-if,
    snapshot versions and the per-segment cap grid (gatekeeper/admin_site.py)."""

    default_site = "gatekeeper.admin_site.GatekeeperAdminSite"
