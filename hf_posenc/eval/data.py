"""Where evaluation text comes from: local files and folders, Hugging Face datasets, or the default corpus."""

from __future__ import annotations

import os
from dataclasses import dataclass

# The default corpus: the public-domain books that sit beside a checkout of the project
# (../shared/data/books); HF_POSENC_CORPUS may point to any other folder of .txt files.
_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS_DIRS = (
    os.environ.get("HF_POSENC_CORPUS", ""),
    os.path.normpath(os.path.join(_HERE, "..", "..", "..", "shared", "data", "books")),
)


@dataclass
class Document:
    name: str
    text: str


def strip_gutenberg(text: str) -> str:
    """Drop the Project Gutenberg header and footer when present, so that only the book is scored."""
    start = text.find("*** START OF")
    if start != -1:
        start = text.find("\n", start) + 1
        text = text[start:]
    end = text.find("*** END OF")
    if end != -1:
        text = text[:end]
    return text.strip()


def read_text_file(path: str) -> Document:
    if not os.path.isfile(path):
        raise ValueError(f"text file not found: {path}")
    with open(path, encoding="utf-8", errors="replace") as f:
        return Document(os.path.basename(path), strip_gutenberg(f.read()))


def read_text_dir(path: str) -> list[Document]:
    if not os.path.isdir(path):
        raise ValueError(f"text folder not found: {path}")
    files = sorted(f for f in os.listdir(path) if f.endswith((".txt", ".md")))
    if not files:
        raise ValueError(f"no .txt or .md files in {path}")
    return [read_text_file(os.path.join(path, f)) for f in files]


def default_corpus() -> list[Document]:
    for folder in DEFAULT_CORPUS_DIRS:
        if folder and os.path.isdir(folder):
            return read_text_dir(folder)
    raise ValueError(
        "no default corpus found (looked in HF_POSENC_CORPUS and ../shared/data/books); pass --text-file, "
        "--text-dir or --dataset."
    )


def read_dataset(name: str, config: str | None = None, split: str = "test", column: str = "text",
                 limit: int | None = None) -> list[Document]:
    """A Hugging Face dataset by Hub name (e.g. ``pg19``, ``hoskinson-center/proof-pile``) or a folder
    written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    import datasets

    if os.path.isdir(name):
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"split {split!r} not in {name}; it has {sorted(ds)}")
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name, config, split=split, streaming=limit is not None)
    if column not in (ds.column_names or []):
        raise ValueError(f"column {column!r} not in dataset {name}; columns: {ds.column_names}")
    docs = []
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            break
        docs.append(Document(f"{os.path.basename(name.rstrip('/'))}[{i}]", row[column]))
    return docs
