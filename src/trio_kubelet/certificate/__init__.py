"""The node's certificates from the cluster: TLS bootstrap, rotation of client and serving ones."""
