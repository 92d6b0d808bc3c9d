"""The event stream: every decision the ledger keeps, every outcome and every
change of the suppression list and of preferences in one order, pulled over REST or posted to
the company's webhook endpoints."""
