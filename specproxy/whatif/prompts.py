"""The token ids an engine saw and produced for one ``--capture full`` record: the model's chat template (rendered
as transformers renders it for vLLM: sandboxed jinja2, ``trim_blocks``, ``lstrip_blocks``, ``add_generation_prompt``)
and its ``tokenizer.json``, both read from the model folder offline. A record whose prompt or completion length
differs from the server's usage is not token-exact and is skipped by the caller."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specproxy.core.record import Record


class TokenizationError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Tokens:
    prompt: list[int]
    output: list[int]


class ModelTokens:
    def __init__(self, folder: Path) -> None:
        folder = folder.parent if folder.is_file() else folder
        if not (folder / "tokenizer.json").is_file():
            raise TokenizationError(f"no tokenizer.json in {folder}")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            from tokenizers import Tokenizer
        except ImportError as e:
            raise TokenizationError(f"a token-exact replay needs {e.name}: pip install 'specproxy[tokenizer]'") from e
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg: dict[str, Any] = {}
        if (folder / "tokenizer_config.json").is_file():
            cfg = json.loads((folder / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(template) if isinstance(template, str) else None
        self.specials = {k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)}
        eos = cfg.get("eos_token")
        self.eos = self.tok.token_to_id(eos) if isinstance(eos, str) else None

    def of(self, rec: Record) -> Tokens:
        body = rec.get("request")
        text = rec.get("response_text")
        if not isinstance(body, dict) or not isinstance(text, str):
            raise TokenizationError("no captured request body and response text (record with --capture full)")
        if isinstance(body.get("messages"), list):
            if self.template is None:
                raise TokenizationError("a chat request, and the model folder has no chat template")
            prompt_text = self.template.render(messages=body["messages"], add_generation_prompt=True, **self.specials)
            prompt = self.tok.encode(prompt_text, add_special_tokens=False).ids
        elif isinstance(body.get("prompt"), str):
            prompt = self.tok.encode(body["prompt"], add_special_tokens=True).ids
        else:
            raise TokenizationError("request body has neither messages nor a string prompt")
        output = self.tok.encode(text, add_special_tokens=False).ids
        if rec.get("finish_reason") == "stop" and self.eos is not None:
            output.append(self.eos)  # vLLM counts the stop token among the completion tokens
        return Tokens(prompt, output)
