"""Recording: the lines the agent writes (records), how it writes them, and their JSON codecs.

A leaf the decision shells import; ``replay/`` reads recordings back and re-decides them.
"""
