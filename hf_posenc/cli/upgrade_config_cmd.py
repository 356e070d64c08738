"""``hf-posenc upgrade-config FOLDER``: add transformers 4's RoPE keys (``rope_theta``, ``rope_scaling``) beside
``rope_parameters`` to a checkpoint folder saved with transformers 5, so that loaders on transformers 4 (TGI,
engines pinned below transformers 5) read the model it is."""

from __future__ import annotations

from ..publishing.config_upgrade import upgrade_config
from .parser import DefaultsShown


def add_parser(sub) -> None:
    up = sub.add_parser("upgrade-config", allow_abbrev=False, formatter_class=DefaultsShown,
                        help="add transformers 4's RoPE keys (rope_theta, rope_scaling) beside rope_parameters to a "
                             "checkpoint folder saved with transformers 5; a RoPE transformers 4.57 would compute "
                             "otherwise is refused.")
    up.add_argument("folder", help="the checkpoint folder (it holds config.json).")
    where = up.add_mutually_exclusive_group(required=True)
    where.add_argument("--in-place", action="store_true",
                       help="rewrite FOLDER's config.json (atomically; no other file is touched).")
    where.add_argument("--output", default=None,
                       help="write the upgraded checkpoint into this new folder instead (its files linked, or "
                            "copied where the filesystem cannot link); FOLDER stays as it is.")


def run(args, command: str) -> int:
    done = upgrade_config(args.folder, output=args.output, in_place=args.in_place)
    if not done.keys:
        print(f"{done.folder}: config.json holds no rope_parameters; nothing to add (transformers 4 reads it as "
              "transformers 5 does)")
        return 0
    for path, keys in done.keys.items():
        print(f"{done.folder}: config.json{' ' + path[:-1] if path else ''} now carries "
              f"{', '.join(sorted(keys))} beside rope_parameters")
    if done.replaced:
        print(f"replaced transformers-4 keys that stated another RoPE: {', '.join(done.replaced)}")
    return 0
