"""``hf-posenc upload``: upload a folder saved by ``hf-posenc patch`` (e.g. after a failed upload)."""

from __future__ import annotations

from ..publishing.hub import upload
from .flags import upload_flags
from .parser import DefaultsShown


def add_parser(sub) -> None:
    up = sub.add_parser("upload", allow_abbrev=False,
                        help="upload a folder saved by 'hf-posenc patch' (e.g. after a failed upload).",
                        formatter_class=DefaultsShown)
    up.add_argument("folder", help="the saved checkpoint folder.")
    up.add_argument("repo_id", help="the Hub repo, user/name (created if missing).")
    upload_flags(up)


def run(args, command: str) -> int:
    url = upload(args.folder, args.repo_id, private=args.private, revision=args.revision,
                 commit_message=args.commit_message, timeout=args.timeout)
    print(f"uploaded {args.folder} -> {url}")
    return 0
