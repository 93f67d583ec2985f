"""Many visitors at once: the room (one decode loop, a batched step), torch's thread count per step, lockstep turns, and the engine in a process of its own (remote, engine_process, wire)."""
