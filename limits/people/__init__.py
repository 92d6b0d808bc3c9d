"""People: what each person says (preferences per topic and channel, their own
frequency, the hosted page and one-click unsubscribe, an import of a company's file) and the
suppression list, each journalled so that every process's gate follows within seconds; a user's
lookup page."""
