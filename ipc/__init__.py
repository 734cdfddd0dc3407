"""The shared memory between the engine and the workers, and its protocol:
record layouts and counters (layout.py), request parameters (params.py),
segments and semaphores (shm.py), SPSC rings (ring.py), per-request channels
(channel.py), the arena of one instance (arena.py), the engine's end
(server.py) and the workers' end (client.py). The lowest layer: it imports
nothing of engine/ or frontends/.
"""
