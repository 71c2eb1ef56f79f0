"""Generated CRI runtime.v1 protobuf (upb) messages, in a private descriptor pool: run scripts/gen_protos.py, do not edit."""
