"""Where evaluation text comes from: local files and folders, Hugging Face datasets, or the default corpus.

The default corpus, in order: the folder named by ``HF_POSENC_CORPUS``; the public-domain books beside a
checkout of the project (``../shared/data/books``); otherwise the built-in ``python-docs`` corpus, which
exists on every fresh install without network: the Python Language Reference topics that ship with
CPython itself (``pydoc_data.topics``, about 470k characters of English prose and code, ~115k tokens),
split into four documents.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass

_HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT_BOOKS = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "shared", "data", "books"))


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


def check_encoding(encoding: str) -> str:
    try:
        return codecs.lookup(encoding).name
    except (LookupError, TypeError):
        raise ValueError(f"unknown text encoding {encoding!r}; e.g. utf-8, latin-1, cp1252, utf-16") from None


def read_text_file(path: str, encoding: str = "utf-8") -> Document:
    """The text of ``path`` decoded as ``encoding``. Bytes that are not valid in it are an error naming the
    file and the offset (scoring replacement characters would measure the wrong text)."""
    check_encoding(encoding)
    if os.path.isdir(path):
        raise ValueError(f"text file {path!r} is a folder; pass a folder of .txt/.md files with --text-dir")
    if not os.path.isfile(path):
        raise ValueError(f"text file not found: {path}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not {encoding} text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
                         "pass its encoding with --encoding (e.g. --encoding latin-1)") from None
    return Document(os.path.basename(path), strip_gutenberg(text))


def read_text_dir(path: str, encoding: str = "utf-8") -> list[Document]:
    if not os.path.isdir(path):
        raise ValueError(f"text folder not found: {path}")
    files = sorted(f for f in os.listdir(path) if f.endswith((".txt", ".md")) and os.path.isfile(os.path.join(path, f)))
    if not files:
        raise ValueError(f"no .txt or .md files in {path}")
    return [read_text_file(os.path.join(path, f), encoding) for f in files]


BUILTIN_CORPORA = ("python-docs",)


def builtin_corpus(name: str = "python-docs", documents: int = 4) -> list[Document]:
    """A corpus that needs no file and no network: ``python-docs`` is CPython's own Language Reference
    topics (``pydoc_data.topics``, sorted by topic), cut at topic boundaries into ``documents`` parts of
    about equal size."""
    if name not in BUILTIN_CORPORA:
        raise ValueError(f"unknown built-in corpus {name!r}; available: {', '.join(BUILTIN_CORPORA)}")
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # some distributions strip it
        raise ValueError("the built-in corpus 'python-docs' needs CPython's pydoc_data module, which this "
                         "Python lacks; pass --text-file, --text-dir or --dataset.") from err
    parts = [topics[k].strip() for k in sorted(topics)]
    total = sum(len(p) for p in parts)
    docs, current, size = [], [], 0
    for part in parts:
        current.append(part)
        size += len(part)
        if size >= total / documents * (len(docs) + 1) and len(docs) < documents - 1:
            docs.append(current)
            current = []
    docs.append(current)
    return [Document(f"python-docs[{i}]", "\n\n".join(d)) for i, d in enumerate(docs) if d]


def default_corpus() -> list[Document]:
    """``HF_POSENC_CORPUS``, else the books beside a checkout, else the built-in ``python-docs`` corpus."""
    chosen = os.environ.get("HF_POSENC_CORPUS", "")
    if chosen:
        return read_text_dir(chosen)  # named explicitly: a missing folder is an error, not a fallback
    if os.path.isdir(CHECKOUT_BOOKS):
        return read_text_dir(CHECKOUT_BOOKS)
    return builtin_corpus()


def read_dataset(name: str, config: str | None = None, split: str = "test", column: str = "text",
                 limit: int | None = None) -> list[Document]:
    """A Hugging Face dataset by Hub name (e.g. ``pg19``, ``hoskinson-center/proof-pile``) or a folder
    written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``. A missing folder, a column that is not
    there or holds no text, are errors naming them (and the text columns there are), before any model loads."""
    ds = _open_dataset(name, config, split, limit)
    _check_column(ds, name, column)
    docs = []
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            break
        if not isinstance(row[column], str):
            raise ValueError(f"row {i} of dataset {name!r}'s column {column!r} is {type(row[column]).__name__}, "
                             "not text; pass a column of strings with --column")
        docs.append(Document(f"{os.path.basename(name.rstrip('/'))}[{i}]", row[column]))
    return docs


def _open_dataset(name: str, config: str | None, split: str, limit: int | None):
    import datasets

    if os.path.isdir(name):
        try:
            ds = datasets.load_from_disk(name)
        except FileNotFoundError as err:
            raise ValueError(f"--dataset {name!r} is a folder but not one written by save_to_disk "
                             f"({' '.join(str(err).split())})") from None
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"split {split!r} not in {name}; it has {sorted(ds)}")
            ds = ds[split]
        return ds
    if os.path.isabs(name) or name.startswith((".", "~")) or os.path.exists(name):
        raise ValueError(f"--dataset {name!r}: no such folder (--dataset takes a folder written by save_to_disk "
                         "or a Hub dataset name such as pg19)")
    try:
        return datasets.load_dataset(name, config, split=split, streaming=limit is not None)
    except (FileNotFoundError, ConnectionError) as err:
        raise ValueError(f"--dataset {name!r} is not a local folder, and the Hub did not give it "
                         f"({' '.join(str(err).split())[:300]})") from None


def _kind(feature) -> str:
    """A column's type in words: int64, string, dict, list, ..."""
    dtype = getattr(feature, "dtype", None)
    if isinstance(dtype, str) and type(feature).__name__ == "Value":
        return dtype
    return "dict" if isinstance(feature, dict) else type(feature).__name__.lower()


def _check_column(ds, name: str, column: str) -> None:
    """``column`` is a column of ``ds`` holding text (where the dataset says what its columns hold)."""
    features = getattr(ds, "features", None)
    if features is None:  # a streamed dataset may not say; each row is checked as it comes
        if ds.column_names is not None and column not in ds.column_names:
            raise ValueError(f"column {column!r} not in dataset {name}; columns: {ds.column_names}")
        return
    kinds = {c: _kind(f) for c, f in features.items()}
    text = [c for c, k in kinds.items() if k in ("string", "large_string")]
    if column not in kinds:
        raise ValueError(f"column {column!r} not in dataset {name}; columns: {list(kinds)}; text columns: {text}")
    if column not in text:
        raise ValueError(f"column {column!r} of dataset {name} holds {kinds[column]}, not text; text columns: "
                         f"{', '.join(map(repr, text)) or 'none'} (pass one with --column)")


# -- the documents a command asks for, and their tokens --------------------------------------------------------
def gather_documents(text_file=None, text_dir=None, dataset=None, dataset_config=None, split="test",
                     column="text", limit=None, corpus=None, encoding="utf-8") -> list[Document]:
    """The documents asked for (files and folders read as ``encoding``: one path or a list; a dataset, a built-in
    corpus), else the default corpus."""
    docs: list[Document] = []
    if corpus:
        docs.extend(builtin_corpus(corpus))
    for path in _paths(text_file):
        docs.append(read_text_file(path, encoding))
    for path in _paths(text_dir):
        docs.extend(read_text_dir(path, encoding))
    if dataset:
        docs.extend(read_dataset(dataset, dataset_config, split, column, limit))
    if not docs:
        docs = default_corpus()
    return docs[:limit] if limit else docs


def _paths(given) -> list:
    """One path (a string or os.PathLike) or an iterable of them, as a list; None as none."""
    if given is None:
        return []
    return [given] if isinstance(given, (str, os.PathLike)) else list(given)


def tokenize_documents(tok, docs: list[Document], max_tokens: int | None = None) -> list:
    """Token ids of each document, once for every method and length (cut to ``max_tokens`` when given)."""
    import torch

    out = []
    for d in docs:
        text = d.text if max_tokens is None else d.text[: max_tokens * 12]  # ~12 chars bound a token from above
        ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        out.append(torch.tensor(ids[:max_tokens] if max_tokens else ids, dtype=torch.long))
    return out


def corpus_stream(tok, docs: list[Document], max_tokens: int = 300_000) -> list[int]:
    """The documents' tokens, joined (at most ``max_tokens``): the filler the needle documents are cut from."""
    stream: list[int] = []
    for d in docs:
        stream += tok(d.text[: max_tokens * 8], add_special_tokens=False, verbose=False)["input_ids"]
        if len(stream) >= max_tokens:
            break
    return stream[:max_tokens]
