"""Kubernetes object models (pydantic v2) used by the agent."""
