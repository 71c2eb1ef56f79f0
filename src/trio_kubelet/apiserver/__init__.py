"""Talking to the kube-apiserver: kubeconfig, an httpx client with QPS limits, list+watch."""
