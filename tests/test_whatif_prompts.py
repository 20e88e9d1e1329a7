"""The token ids of a ``--capture full`` record (specproxy.whatif.prompts.ModelTokens): the chat template rendered
as vLLM renders it, the prompt and the reply encoded by the model's tokenizer.json, the stop token counted on a
stop. The model folder is a tiny word-level tokenizer written by the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specproxy.core.record import Record
from specproxy.whatif.prompts import ModelTokens, TokenizationError, Tokens

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

WORDS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "hi", "there", "how", "are", "you", "sys"]
ID = {w: i for i, w in enumerate(WORDS)}
TEMPLATE = (
    "{{ bos_token }} {% for m in messages %}\n"
    "<|{{ m['role'] }}|> {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _folder(tmp_path: Path, config: dict[str, Any] | None = None, jinja: str | None = None) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel(vocab=ID, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"} if config is None else config
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return tmp_path


def _rec(request: Any, text: Any, finish: str | None = "stop") -> Record:
    return {"request": request, "response_text": text, "finish_reason": finish}  # type: ignore[typeddict-item]


def test_a_chat_prompt_is_rendered_with_the_generation_prompt_and_the_stop_token_counted(tmp_path: Path) -> None:
    mt = ModelTokens(_folder(tmp_path))
    rec = _rec({"messages": [{"role": "user", "content": "hi there"}]}, "how are you")
    assert mt.of(rec) == Tokens(
        prompt=[ID["<s>"], ID["<|user|>"], ID["hi"], ID["there"], ID["<|assistant|>"]],
        output=[ID["how"], ID["are"], ID["you"], ID["</s>"]],
    )
    assert mt.of(_rec(rec["request"], "how are you", finish="length")).output == [ID["how"], ID["are"], ID["you"]]


def test_a_completion_prompt_is_encoded_as_it_is(tmp_path: Path) -> None:
    mt = ModelTokens(_folder(tmp_path) / "tokenizer.json")  # a file in the folder names the folder
    assert mt.of(_rec({"prompt": "hi you"}, "there", finish=None)) == Tokens([ID["hi"], ID["you"]], [ID["there"]])


def test_the_template_file_wins_over_the_config(tmp_path: Path) -> None:
    mt = ModelTokens(_folder(tmp_path, jinja="{% for m in messages %}sys {{ m['content'] }} {% endfor %}"))
    assert mt.of(_rec({"messages": [{"role": "user", "content": "hi"}]}, "you")).prompt == [ID["sys"], ID["hi"]]


def test_without_an_eos_token_nothing_is_appended(tmp_path: Path) -> None:
    mt = ModelTokens(_folder(tmp_path, config={}))
    assert (mt.template, mt.eos) == (None, None)
    assert mt.of(_rec({"prompt": "hi"}, "you")).output == [ID["you"]]
    with pytest.raises(TokenizationError, match="no chat template"):
        mt.of(_rec({"messages": [{"role": "user", "content": "hi"}]}, "you"))


@pytest.mark.parametrize(
    ("rec", "message"),
    [
        (_rec(None, "x"), "no captured request body and response text"),
        (_rec({"prompt": "hi"}, None), "no captured request body and response text"),
        (_rec({"prompt": ["hi"]}, "x"), "neither messages nor a string prompt"),
    ],
)
def test_records_that_cannot_be_tokenized_say_why(tmp_path: Path, rec: Record, message: str) -> None:
    with pytest.raises(TokenizationError, match=message):
        ModelTokens(_folder(tmp_path)).of(rec)


def test_a_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenizationError, match=r"no tokenizer\.json in"):
        ModelTokens(tmp_path)
