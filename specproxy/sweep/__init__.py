"""``specproxy sweep``: one server driven at a series of loads (``drive``), and servers started from a command and
stopped after (``servers``). :func:`specproxy.sweep.drive.sweep_target` is the core another command can call per
configuration: a target URL and levels in, records per level out."""
