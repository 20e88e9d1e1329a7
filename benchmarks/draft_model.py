"""A draft model for speculative decoding made of a model's first layers, sharing its tokenizer:

    python -m benchmarks.draft_model MODEL_DIR OUT_DIR [--layers 6]

Run with a python that has torch and transformers (an engine's). The draft proposes what a shallow copy of the target
would say, so it accepts less than the whole model and costs a fraction of a step: a real ``draft_model`` engine for
the real-engine harness without downloading a second model.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.draft_model", description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=6)
    a = ap.parse_args()
    import torch  # type: ignore[import-not-found]
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # type: ignore[import-not-found]

    cfg = AutoConfig.from_pretrained(a.model)
    if not 0 < a.layers < cfg.num_hidden_layers:
        ap.error(f"--layers must be between 1 and {cfg.num_hidden_layers - 1}")
    cfg.num_hidden_layers = a.layers
    # the layers past the cut are in the checkpoint but not in the config: left out on loading
    model = AutoModelForCausalLM.from_pretrained(a.model, config=cfg, dtype=torch.bfloat16)
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out)
    AutoTokenizer.from_pretrained(a.model).save_pretrained(a.out)


if __name__ == "__main__":
    main()
