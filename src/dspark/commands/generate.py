"""``dspark generate``: one answer through the engine, streamed as the server streams it."""

from __future__ import annotations

import argparse
import json
import sys

from dspark.commands.loading import load_inference_target
from dspark.data.chat import chat_prompt_ids, user_messages
from dspark.engine import Engine, EngineConfig
from dspark.formats.build import build_drafter
from dspark.protocols import SamplingParams
from dspark.server.textstream import TextStream


def main_generate(args: argparse.Namespace) -> int:
    """Run ``dspark generate`` (arguments: :mod:`~dspark.commands.args.generate`)."""
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
    target = load_inference_target(args.target, args.dtype)
    drafter = build_drafter(args.drafter, target)
    tok = target.tokenizer
    if args.raw:
        prompt_ids = tok(args.prompt)["input_ids"]
    else:
        prompt_ids = chat_prompt_ids(tok, user_messages(args.prompt))

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    # The server's incremental detokenizer: holds back partial UTF-8 characters and any
    # text that may still become a stop string, so a stop string is never printed.
    stream = TextStream(decode, params.stop)

    def write(new: list[int]) -> None:
        sys.stdout.write(stream.push(new))
        sys.stdout.flush()

    # One request through the engine (a KV slot just big enough for it): up to γ drafts per
    # round, from the proposer the payoff controller picks, or none where drafting does not pay.
    capacity = min(target.max_context, len(prompt_ids) + args.max_tokens)
    config = EngineConfig(
        block_size=args.block_size,
        policy="fixed",
        max_batch=1,
        max_seq_len=capacity,
        payoff=not args.no_payoff_control,
        choose_proposer=not args.no_proposer_choice,
    )
    engine = Engine(target, drafter, config, decode=decode)
    request = engine.submit(prompt_ids, params, on_tokens=None if args.json else write)
    while engine.has_work():
        engine.step()
    result = engine.pop_result(request)
    failed = result.finish_reason == "error"
    if args.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "num_tokens": len(result.token_ids),
                    "tau": result.tau,
                    "tokens_per_s": result.tokens_per_s,
                    "finish_reason": result.finish_reason,
                    **({"error": result.error or "the engine failed the request"} if failed else {}),
                }
            )
        )
    else:
        sys.stdout.write(stream.finish(result.text) + "\n")
        print(
            f"τ = {result.tau:.2f} tokens/round, {result.tokens_per_s:.1f} tokens/s, "
            f"{len(result.token_ids)} tokens ({result.finish_reason})",
            file=sys.stderr,
        )
    if failed:  # what was printed is not an answer: say so, and exit as a failure (a script checks $?)
        print(f"dspark: error: the request failed: {result.error or 'the engine failed it'}", file=sys.stderr)
        return 1
    return 0
