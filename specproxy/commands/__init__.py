"""One module per command group; each exposes ``register(app)``. A command parses its options into a config object
and runs one async entry point through :func:`specproxy.commands.common.run_async`."""
