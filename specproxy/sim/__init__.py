"""specproxy sim: a vLLM V1 stand-in with speculative decoding and known ground truth.

Public API: `SimConfig` (every knob), `Profile`, `load_profiles`, `start_sim(cfg) -> SimHandle` (tests, demo)
and `serve(cfg, ready=...)` (the CLI). The pure engine is `specproxy.sim.engine.EngineCore`.
"""

from specproxy.sim.config import DEFAULT_PROFILES, Profile, SimConfig, load_profiles
from specproxy.sim.server import SimHandle, serve, start_sim

__all__ = ["DEFAULT_PROFILES", "Profile", "SimConfig", "SimHandle", "load_profiles", "serve", "start_sim"]
