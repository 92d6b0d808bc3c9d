"""The policy: the settings a marketer authors (caps, cap rules, quiet hours,
topics, the global control group), their one rule of validity and their history, the cache every
gate call reads them through, a user's quota, and their admin pages and REST views."""
