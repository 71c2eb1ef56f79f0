"""Pure decisions: no I/O, no clock reads, no trio."""
