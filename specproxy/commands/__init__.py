"""One module per command group; each exposes ``register(app)`` and registers its commands through
:func:`specproxy.commands.common.command`, so that every command body runs inside the one error boundary. A command
parses its options into a config object and runs one async entry point through
:func:`specproxy.commands.common.run_async`."""
