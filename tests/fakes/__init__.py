"""Local stand-ins for outside services that cannot run here (FCM, APNs), spoken to over real
sockets by the real client libraries."""
