"""Generated CRI runtime.v1 messages and grpclib stubs: run scripts/gen_protos.py, do not edit."""
