"""Print the README's table of what is supported (methods x kind x families x tune x engines), generated from the
method records; --write puts it between the README's markers (tests/test_docs.py checks it is current).

    python scripts/support_table.py --write
"""

from __future__ import annotations

import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from hf_posenc.cli.reference_docs import support_table, with_support_table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--write", action="store_true", help="put the table into README.md between its markers.")
    args = p.parse_args()
    if not args.write:
        print(support_table())
        return
    path = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        text = with_support_table(f.read())
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
