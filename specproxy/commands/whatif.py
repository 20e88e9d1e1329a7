"""``specproxy whatif``: vLLM's ngram speculation replayed on ``--capture full`` greedy recordings, per workload and
k: acceptance, mean acceptance length, drafting share, and a predicted speedup from advise's step-cost model."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from specproxy.analysis.advise.model import DEFAULT_DRAFT_COST
from specproxy.commands.common import command, fail
from specproxy.core.figures import acceptance_rate, mean_acceptance_length
from specproxy.core.record import read_records
from specproxy.whatif.ngram import Replay, replay
from specproxy.whatif.prompts import ModelTokens, TokenizationError


def parse_ks(value: str) -> list[int]:
    try:
        if ".." in value:
            a, b = value.split("..", 1)
            ks = list(range(int(a), int(b) + 1))
        else:
            ks = [int(v) for v in value.split(",")]
    except ValueError:
        fail(f"--k: {value!r} is not N, N,M or A..B")
    if not ks or min(ks) < 1:
        fail(f"--k: {value!r} needs k >= 1")
    return ks


def _row(workload: str, k: int, r: Replay, requests: int, c: float) -> dict[str, Any]:
    cost = r.decode_steps + c * r.draft_tokens  # step cost (1 + c * drafted) per decode step, in plain steps
    plain = r.decode_steps + r.accepted  # decode steps without speculation: one token each
    return {
        "workload": workload,
        "k": k,
        "requests": requests,
        "drafts": r.drafts,
        "draft_tokens": r.draft_tokens,
        "accepted": r.accepted,
        "tail_open": r.tail_open,
        "acceptance": acceptance_rate(r.accepted, r.draft_tokens),
        "acceptance_high": acceptance_rate(r.accepted + r.tail_open, r.draft_tokens),
        "mean_acceptance_length": mean_acceptance_length(r.accepted, r.drafts),
        "drafting_share": r.drafts / r.decode_steps if r.decode_steps else None,
        "per_position": r.per_position,
        "predicted_speedup": plain / cost if cost else None,
    }


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def register(app: typer.Typer) -> None:
    @command(app, "whatif")
    def whatif_cmd(
        records: Annotated[list[Path], typer.Argument(help="Record files made with --capture full, greedy requests.")],
        tokenizer: Annotated[Path, typer.Option(help="The model folder (tokenizer.json, chat template).")],
        method: Annotated[str, typer.Option(help="ngram (vLLM's prompt lookup).")] = "ngram",
        k: Annotated[str, typer.Option("--k", help="Draft tokens: N, N,M or A..B.")] = "1..5",
        prompt_lookup_min: Annotated[int, typer.Option(help="vLLM's prompt_lookup_min.")] = 2,
        prompt_lookup_max: Annotated[int, typer.Option(help="vLLM's prompt_lookup_max.")] = 4,
        max_model_len: Annotated[int, typer.Option(help="The engine's --max-model-len.")] = 2048,
        draft_cost: Annotated[
            float, typer.Option(help="Cost of one draft token as a fraction of a plain step (advise's c).")
        ] = DEFAULT_DRAFT_COST,
        format: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
    ) -> None:
        """Predict what ngram speculation would accept on recorded traffic, per workload and k, with no GPU."""
        if method != "ngram":
            fail(f"--method {method!r}: only ngram can be replayed (suffix decoding is not yet)")
        if format not in ("table", "json"):
            fail(f"--format {format!r}: table or json")
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            fail("need 1 <= --prompt-lookup-min <= --prompt-lookup-max")
        ks = parse_ks(k)
        for p in records:
            if not p.exists():
                fail(f"{p}: no such file")
        try:
            tok = ModelTokens(tokenizer)
        except TokenizationError as e:
            fail(f"--tokenizer: {e}")
        seqs: dict[str, list[Any]] = defaultdict(list)
        seen = skipped_capture = skipped_len = 0
        for p in records:
            for rec in read_records(p):
                if not str(rec.get("path") or "").endswith("completions") or rec.get("status") != 200:
                    continue
                seen += 1
                try:
                    t = tok.of(rec)
                except TokenizationError:
                    skipped_capture += 1
                    continue
                pt, ct = rec.get("prompt_tokens"), rec.get("completion_tokens")
                if (pt is not None and pt != len(t.prompt)) or (ct is not None and ct != len(t.output)):
                    skipped_len += 1
                    continue
                seqs[str(rec.get("workload") or "default")].append(t)
        if seen == 0:
            fail("no completion records in the files")
        if not seqs:
            fail(
                f"none of {seen} records can be replayed token-exactly: {skipped_capture} without --capture full "
                f"body and text, {skipped_len} whose token counts differ from the server's usage"
            )
        rows = []
        for wl in sorted(seqs):
            for kk in ks:
                total = Replay(kk, per_position=[0] * kk)
                for t in seqs[wl]:
                    total.add(replay(t.prompt, t.output, kk, prompt_lookup_min, prompt_lookup_max, max_model_len))
                rows.append(_row(wl, kk, total, len(seqs[wl]), draft_cost))
        out = {
            "method": method,
            "prompt_lookup_min": prompt_lookup_min,
            "prompt_lookup_max": prompt_lookup_max,
            "max_model_len": max_model_len,
            "draft_cost": draft_cost,
            "records": seen,
            "replayed": sum(len(v) for v in seqs.values()),
            "skipped_no_capture": skipped_capture,
            "skipped_token_mismatch": skipped_len,
            "rows": rows,
        }
        if format == "json":
            typer.echo(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
            return
        cols = [
            "workload",
            "k",
            "requests",
            "acceptance",
            "acceptance_high",
            "mean_acceptance_length",
            "drafting_share",
            "predicted_speedup",
            "tail_open",
        ]
        typer.echo("  ".join(cols))
        for r in rows:
            typer.echo("  ".join(_fmt(r[c]) for c in cols))
        typer.echo(
            f"replayed {out['replayed']} of {seen} records ({skipped_capture} without capture, {skipped_len} token "
            f"count mismatch); speedup at draft cost c={draft_cost} per draft token (advise's step model; "
            "--draft-cost to change); tail_open: last-step drafts past the recorded end, not counted in acceptance, "
            "counted in acceptance_high"
        )
