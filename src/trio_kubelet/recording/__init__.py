"""Recording: the lines the agent writes (records), how it writes them, their JSON codecs, and
the decision kinds: how each decision is recorded by its shell and re-decided on replay.

Imported by the decision shells and by ``replay/``, which reads recordings back; it imports
only ``core/`` and ``model/`` of the project, and ``records`` imports nothing of it.
"""
