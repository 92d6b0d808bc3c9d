"""Studies: cap experiments (arms of rules, their lifecycle) and what a study
measures (its members, their sends and the outcome events the company posts, fed by the ledger's
drain), with the experiments report, its admin and its REST views."""
