"""``dspark train``: the glue from its arguments to :func:`dspark.training.trainer.train`.

One process: ``dspark train ...``. Many: ``torchrun --nproc_per_node N -m dspark train ...``
(every rank runs the same command; rank 0 writes checkpoints, logs and the final
drafter folder).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from dspark.commands.loading import is_tiny, load_target, set_threads, training_records
from dspark.data.cache import FeatureCache
from dspark.data.samples import TrainDataset, tokenize_records
from dspark.drafters.draft_vocab import choose_draft_ids, with_draft_vocab
from dspark.drafters.kinds import KINDS, kind_of_config
from dspark.drafters.target_choices import apply_target_choices
from dspark.errors import DsparkError
from dspark.eval.online import online_tau_eval
from dspark.formats.folder import drafter_config_json, drafter_folder_check, publish_checkpoint
from dspark.output_folders import claim_outputs
from dspark.presets import drafters as presets
from dspark.training import distributed
from dspark.training.recipe import train_config
from dspark.training.trainer import train

log = logging.getLogger(__name__)


def _drafter_config(method: str, preset: str | None, tiny: bool):
    name = preset or (f"{method}_tiny" if tiny else None)
    if name is None:
        return KINDS[method].config_cls()
    fn = getattr(presets, name, None)
    if not callable(fn) or name.startswith("_"):
        names = sorted(
            n for n in dir(presets) if n.endswith(("_tiny", "_8b", "_debug")) and not n.startswith("_")
        )
        raise DsparkError(f"unknown preset {name!r}; choose from {', '.join(names)}")
    config = fn()
    if kind_of_config(config).name != method:
        raise DsparkError(f"preset {name!r} is not a {method} preset")
    return config


def _feature_cache(root: Path | None, target, data, template_kwargs, max_length: int):
    """The opened, checked cache at ``root`` (None: online features); refuses one of other data."""
    if root is None:
        return None
    cache = FeatureCache.open(root)  # shard checksums
    cache.check_compatible(target, template_kwargs=template_kwargs, max_length=max_length)
    cached = TrainDataset(cache.token_samples())
    if cached.fingerprint != data.fingerprint:
        raise DsparkError(
            f"the feature cache at {root} holds {len(cached)} samples built from other data than --data "
            f"({len(data)} samples here); rebuild it with `dspark data cache` on the same files"
        )
    return cache


def _check_recipe_args(args: argparse.Namespace) -> None:
    """The recipe flags' one-line errors, before anything is loaded."""
    used = [
        flag
        for flag, on in (
            ("--warm-start", args.warm_start is not None),
            ("--ce-warmup-frac", args.ce_warmup_frac != 0.0),
            ("--head-lr-mult", args.head_lr_mult != 1.0),
        )
        if on
    ]
    if used and args.drafter != "dspark":
        raise DsparkError(f"{', '.join(used)}: only for --drafter dspark (got {args.drafter})")
    if not 0.0 <= args.ce_warmup_frac < 1.0:
        raise DsparkError(f"--ce-warmup-frac must be in [0, 1), got {args.ce_warmup_frac}")
    if not args.head_lr_mult > 0:
        raise DsparkError(f"--head-lr-mult must be > 0, got {args.head_lr_mult}")
    if args.warm_start is not None and not (args.warm_start / "config.json").is_file():
        raise DsparkError(f"--warm-start {args.warm_start}: not a drafter folder (no config.json)")


# What `dspark train` writes in --out; anything else there is the user's and never touched.
RUN_FILES = ("train_config.json", "metrics.jsonl", "checkpoints", "drafter", "tensorboard")


def _run_folder(out: Path, force: bool, *, write: bool) -> str | None:
    """Claim --out's run files for this run (:mod:`dspark.output_folders`); its run id.

    Every rank checks before anything is loaded, so that all refuse alike; rank 0 writes
    the claim. The drafter folder is checked too: it is replaced at the end, after training.
    """
    run = claim_outputs(out, RUN_FILES, command="train", force=force, write=write)
    drafter_folder_check(out / "drafter", run=run, force=force)
    return run


def main_train(args: argparse.Namespace) -> int:
    """Run ``dspark train`` (arguments: :mod:`~dspark.commands.args.train`)."""
    set_threads(args.threads)
    template_kwargs = args.template_kwargs
    _check_recipe_args(args)
    config = _drafter_config(args.drafter, args.preset, is_tiny(args.target))
    if args.draft_vocab is not None:
        if args.draft_vocab < 1:
            raise DsparkError(f"--draft-vocab must be >= 1, got {args.draft_vocab}")
        config = with_draft_vocab(config, args.draft_vocab)
    cfg = train_config(
        args.out,
        args,
        max_steps=args.steps,
        parallel=args.parallel,
        save_every=args.save_every,
        eval_every=args.eval_every,
        tensorboard=args.tensorboard,
        resume=not args.no_resume,
        activation_checkpointing=args.activation_checkpointing,
        pack_target=args.pack_target,
        warm_start=str(args.warm_start) if args.warm_start else None,
        ce_warmup_frac=args.ce_warmup_frac,
        head_lr_mult=args.head_lr_mult,
        prompt_end_anchors=args.prompt_end_anchors,
    )
    _run_folder(args.out, args.force, write=False)
    with distributed.launch() as world:
        run = _run_folder(args.out, args.force, write=True) if world.is_main else None
        target = load_target(args.target, device=world.device)
        config = apply_target_choices(
            config, target, target_layers=args.target_layers, mask_token=args.mask_token
        )
        if config.target_layer_ids is not None:  # the target computes the features the drafter reads
            target = target.with_layers(config.target_layer_ids)
        data = tokenize_records(
            training_records(args.data, args.limit),
            target.tokenizer,
            max_length=args.max_length,
            template_kwargs=template_kwargs,
        )
        if len(data) == 0:
            raise DsparkError("no training sample has supervised (assistant) tokens")
        if (config.draft_vocab_size or 0) > target.vocab_size:
            raise DsparkError(
                f"--draft-vocab {config.draft_vocab_size} is larger than the target's vocabulary "
                f"({target.vocab_size})"
            )
        torch.manual_seed(args.seed)
        ids = choose_draft_ids(config, data, target.vocab_size)  # N most frequent supervised tokens
        drafter = KINDS[args.drafter].drafter_cls.from_target(target, config, draft_ids=ids)
        cache = _feature_cache(args.feature_cache, target, data, template_kwargs, args.max_length)
        online_eval = online_tau_eval(target, args.eval_prompts) if args.eval_every else None
        result = train(
            cfg,
            target,
            drafter,
            data,
            online_eval=online_eval,
            world=world,
            model_config=lambda d: drafter_config_json(d, target),
            feature_cache=cache,
        )
        if world.is_main:
            # The last checkpoint is already a drafter folder (DESIGN §5.4): publish its two files.
            folder = publish_checkpoint(
                result.checkpoint, args.out / "drafter", target, run=run, force=args.force
            )
            print(
                json.dumps(
                    {
                        "steps": result.step,
                        "seconds": round(result.seconds, 1),
                        "drafter": str(folder),
                        **{k: v for k, v in result.metrics.items() if not k.startswith("acceptance/")},
                    },
                    indent=2,
                )
            )
    return 0
