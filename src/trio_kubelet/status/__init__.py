"""Pod status: the agent's latest view of each pod's API status."""
