"""REST views of cap experiments, their report and the outcome events."""
