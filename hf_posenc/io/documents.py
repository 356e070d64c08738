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


@dataclass(frozen=True)
class DocumentSource:
    """Where a task's documents come from, as the data flags say (``--text-file``, ``--text-dir``, ``--dataset``
    ..., ``--corpus``, ``--limit``): read by :meth:`gather` (nothing chosen: the default corpus)."""

    text_file: list[str] | None = None
    text_dir: list[str] | None = None
    dataset: str | None = None
    dataset_config: str | None = None
    split: str = "test"
    column: str = "text"
    limit: int | None = None
    corpus: str | None = None
    encoding: str = "utf-8"

    @property
    def chosen(self) -> bool:
        """Whether a file, folder, dataset or corpus was named (else the default corpus is read)."""
        return bool(self.text_file or self.text_dir or self.dataset or self.corpus)

    def gather(self) -> list[Document]:
        return gather_documents(self.text_file, self.text_dir, self.dataset, self.dataset_config, self.split,
                                self.column, self.limit, self.corpus, self.encoding)


def documents_of(value: "list[Document] | DocumentSource | None") -> list[Document]:
    """A task's documents field read: a list as it is, a source gathered, None the default corpus."""
    if value is None:
        return default_corpus()
    if isinstance(value, DocumentSource):
        return value.gather()
    docs = list(value)
    wrong = [type(d).__name__ for d in docs if not isinstance(d, Document)]
    if wrong:
        raise ValueError(f"docs must be Documents (hf_posenc.io.documents.read_text_file, gather_documents, ...), a "
                         f"DocumentSource or None (the default corpus); got {', '.join(sorted(set(wrong)))}")
    return docs


def given_documents(value: "list[Document] | DocumentSource | None") -> bool:
    """Whether a documents field names documents (a non-empty list, or a source that chose some)."""
    return value.chosen if isinstance(value, DocumentSource) else bool(value)


# -- held-out text that is training text, compared by content ----------------------------------------------------
PASSAGE_WORDS = 32  # a run of this many words (case and spacing aside) found in both is shared text, not chance
OVERLAP_SHARE, OVERLAP_WORDS = 0.02, 500  # a held-out document sharing more of its words than either is refused


def _passages(text: str):
    """A uint64 hash of every run of PASSAGE_WORDS words of ``text`` (casefolded, split on whitespace), by the
    position of its first word; a shorter text is one hash of all its words."""
    import numpy as np

    words = text.casefold().split()
    codes = np.array([hash(w) for w in words], dtype=np.int64).view(np.uint64)
    if len(words) < PASSAGE_WORDS:
        return np.array([hash(tuple(words))] if words else [], dtype=np.int64).view(np.uint64), len(words)
    out = np.zeros(len(words) - PASSAGE_WORDS + 1, dtype=np.uint64)
    for j in range(PASSAGE_WORDS):  # a polynomial hash of each run, modulo 2**64
        out = out * np.uint64(1_000_003) + codes[j : j + len(out)]
    return out, len(words)


def _covered(matched, words: int) -> int:
    """How many of ``words`` words lie in a matched passage (``matched``: one flag per passage start)."""
    import numpy as np

    if words < PASSAGE_WORDS:
        return words if matched.any() else 0
    return int((np.convolve(matched.astype(np.int64), np.ones(PASSAGE_WORDS, dtype=np.int64))[:words] > 0).sum())


def check_heldout(train: list[Document], held: list[Document], max_tokens: int | None = None) -> None:
    """Refuse held-out documents whose text is in the training documents: compared by content (never by name),
    casefolded with whitespace collapsed, as passages of PASSAGE_WORDS words, over the part of each held-out
    document that its first ``max_tokens`` tokens are read from (all of it when None); a held-out document with
    more than OVERLAP_SHARE of those words, or more than OVERLAP_WORDS words, in passages found in training is
    refused, naming it, the training document it shares most with, and the share. A whole copy (another name,
    case or spacing) is a share of 100%; a quotation of a sentence or two is below both bounds."""
    import numpy as np

    passages = [_passages(scored_text(d.text, max_tokens)) for d in held]
    pool = np.unique(np.concatenate([p for p, _ in passages] or [np.zeros(0, np.uint64)]))
    matched = [np.zeros(len(p), dtype=bool) for p, _ in passages]
    shared: list[dict[str, int]] = [{} for _ in held]
    for doc in train:
        found = pool[np.isin(pool, _passages(doc.text)[0])]
        for k, (p, _) in enumerate(passages):
            hit = np.isin(p, found) if len(found) else np.zeros(len(p), dtype=bool)
            if hit.any():
                matched[k] |= hit
                shared[k][doc.name] = shared[k].get(doc.name, 0) + int(hit.sum())
    for k, doc in enumerate(held):
        words, covered = passages[k][1], _covered(matched[k], passages[k][1])
        if covered and (covered > OVERLAP_WORDS or covered > OVERLAP_SHARE * words):
            part = "" if max_tokens is None else f" in its first {max_tokens * CHARS_PER_TOKEN} characters (scored)"
            raise ValueError(_overlap_message(doc.name, covered, words, shared[k], part))


def _overlap_message(name: str, covered: int, words: int, shared: dict[str, int], part: str) -> str:
    ranked = sorted(shared, key=lambda n: -shared[n])
    others = f" (and {len(ranked) - 1} other training documents)" if len(ranked) > 1 else ""
    return (f"held-out document {name!r} is also in the training data: {covered / words:.0%} of the words "
            f"({covered} of {words}){part} lie in passages of {PASSAGE_WORDS}+ words found in training document "
            f"{ranked[0]!r}{others}, compared by content (case and spacing aside); its held-out perplexity would "
            "be measured on trained text. Pass held-out text that is not in the training data.")


def _paths(given) -> list:
    """One path (a string or os.PathLike) or an iterable of them, as a list; None as none."""
    if given is None:
        return []
    return [given] if isinstance(given, (str, os.PathLike)) else list(given)


CHARS_PER_TOKEN = 12  # bounds a token's characters from above, for cutting a text before tokenizing it


def scored_text(text: str, max_tokens: int | None) -> str:
    """The part of ``text`` whose first ``max_tokens`` tokens are read (all of it when None)."""
    return text if max_tokens is None else text[: max_tokens * CHARS_PER_TOKEN]


def tokenize_documents(tok, docs: list[Document], max_tokens: int | None = None) -> list:
    """Token ids of each document, once for every method and length (cut to ``max_tokens`` when given)."""
    import torch

    out = []
    for d in docs:
        text = scored_text(d.text, max_tokens)
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
