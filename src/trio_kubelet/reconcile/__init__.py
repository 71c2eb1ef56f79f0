"""The sync loop and pod workers: the only place that acts on decisions."""
