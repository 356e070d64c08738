"""mkdocs hook: the reference pages written from the code when the site is built (hf_posenc.reference_docs)."""

from hf_posenc import reference_docs

GENERATED = {"cli.md": reference_docs.cli_reference, "methods.md": reference_docs.methods_reference}


def on_page_markdown(markdown, page, config, files):
    make = GENERATED.get(page.file.src_uri)
    return make() if make is not None else markdown
