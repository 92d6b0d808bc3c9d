from django.apps import AppConfig


class SegmentsConfig(AppConfig):
    name = "segments"
    verbose_name = "Segments"
