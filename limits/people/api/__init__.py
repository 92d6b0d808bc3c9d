"""REST views of people's preferences, their import, and the suppression
list."""
