"""Images: pull policy, pull backoff (and later image GC)."""
