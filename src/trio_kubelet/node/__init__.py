"""The node in the cluster: its Node object, status and Lease (manager.py runs them)."""
