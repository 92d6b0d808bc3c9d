"""manage.py create_api_token <username>: print the user's REST API token (made if needed)."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Print the REST API token of a user, creating it if the user has none."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(username=options["username"])
        except User.DoesNotExist:
            raise CommandError(
                f"No user '{options['username']}'. Create one first (manage.py createsuperuser)."
            ) from None
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
