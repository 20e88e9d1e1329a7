"""``specproxy roofline``: the memory-bandwidth ceiling of decoding, and how much of it a measurement reaches.

- ``model``: the ceiling from parameters, bytes per parameter and bandwidth (or the engine's measured bytes read).
- ``render``: the ceiling and the measurements placed on it, as tables and JSON.
"""
