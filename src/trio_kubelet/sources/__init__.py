"""Event sources: producers that turn the world into typed events."""
