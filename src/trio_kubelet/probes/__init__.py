"""Probes: the workers that run liveness, readiness and startup probes, and their results."""
