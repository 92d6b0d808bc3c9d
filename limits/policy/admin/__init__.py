"""The admin of the policy's settings, a module per kind; `base` holds
what every authored kind's admin shares."""
