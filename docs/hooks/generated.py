"""mkdocs hook: what the site shows from elsewhere, put in when it is built, so that each fact has one home --
the reference pages from the code (hf_posenc.cli.reference_docs), the benchmarks page from the repository's
BENCHMARKS.md, and in any page a ``<!-- README: NAME -->`` line replaced by README.md's section NAME (``pitch``: its
first paragraph; ``first commands``: the two commands under it), its links made the site's."""

import os
import re

from hf_posenc.cli import reference_docs

_INCLUDE = re.compile(r"^<!-- README: (.+?) -->$", re.M)
_SITE_LINKS = ((re.compile(r"\]\(docs/"), "]("), (re.compile(r"\]\(BENCHMARKS\.md"), "](benchmarks.md"))


def _root_file(config, name: str) -> str:
    with open(os.path.join(os.path.dirname(config["docs_dir"]), name), encoding="utf-8") as f:
        return f.read()


def readme_section(readme: str, name: str) -> str:
    """README.md's section ``name`` (its heading line included; ``pitch``: the paragraph under the title; ``first
    commands``: what follows it up to the first section), with links into docs/ and to BENCHMARKS.md written as the
    site's."""
    top = readme.split("\n## ")[0].split("\n\n")
    if name == "pitch":
        text = top[1]
    elif name == "first commands":
        text = "\n\n".join(top[2:])
    else:
        found = re.search(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", readme, re.M | re.S)
        if found is None:
            raise ValueError(f"README.md has no section '## {name}' (a docs page includes it)")
        text = found.group(0)
    for pattern, site in _SITE_LINKS:
        text = pattern.sub(site, text)
    return text.strip()


GENERATED = {"cli.md": lambda config: reference_docs.cli_reference(),
             "methods.md": lambda config: reference_docs.methods_reference(),
             "benchmarks.md": lambda config: _root_file(config, "BENCHMARKS.md")}


def on_page_markdown(markdown, page, config, files):
    make = GENERATED.get(page.file.src_uri)
    if make is not None:
        return make(config)
    if _INCLUDE.search(markdown):
        readme = _root_file(config, "README.md")
        return _INCLUDE.sub(lambda m: readme_section(readme, m.group(1)), markdown)
    return markdown
