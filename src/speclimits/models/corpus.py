"""Build the training corpus from text a fresh Debian/Ubuntu machine can get through its package registries.

Three domains, one document per source file:

``code``
    Python's standard-library source (``sysconfig.get_paths()["stdlib"]``, tests excluded).
``en``
    English prose: ``/usr/share/common-licenses``, README/copyright/NEWS files under
    ``/usr/share/doc``, and English man pages rendered to text with groff.
``ru``
    Russian mixed with C and English: Debian's ``manpages-ru`` and ``manpages-ru-dev``,
    downloaded with ``apt-get download`` and unpacked with ``dpkg -x`` into a scratch folder
    (nothing is installed system-wide), rendered with ``groff -Kutf8 -mandoc -Tutf8``. Many
    pages are only partly translated, so the text switches script naturally.

Each document goes to the held-out split when a hash of its source path says so (a fixed share,
independent of the machine's file order). The builder writes ``<out>/<split>.jsonl`` (one JSON
object per document: ``domain``, ``source``, ``text``) and ``<out>/corpus_meta.json`` (sources,
document counts, bytes and the Cyrillic share per domain and split).

System needs: ``groff`` (with ``preconv``, for ``-K``), ``apt-get`` and ``dpkg`` (only for the
Russian pages; an already unpacked folder can be passed instead), ``gzip`` data readable by Python.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import dumps

DOMAINS = ("code", "en", "ru")
RU_PACKAGES = ("manpages-ru", "manpages-ru-dev")
GROFF_CMD = ("groff", "-Kutf8", "-mandoc", "-Tutf8", "-rHY=0", "-rLL=100n", "-P-cbou")
_CYRILLIC = re.compile(r"[\u0400-\u04FF]")
_LETTER = re.compile(r"[^\W\d_]")
_SPACES = re.compile(r"[ \t]{2,}")
_BLANKS = re.compile(r"\n{3,}")
_SKIP_STDLIB_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "turtledemo"}
_DOC_NAMES = re.compile(r"^(README|NEWS|copyright|AUTHORS|THANKS|TODO|FAQ|HISTORY|CHANGES)([._-].*)?(\.txt|\.md)?(\.gz)?$",
                        re.IGNORECASE)


class CorpusError(SpeclimitsError):
    """The corpus cannot be built (a missing tool, an empty domain)."""


@dataclass
class Document:
    domain: str
    source: str
    text: str


@dataclass
class CorpusConfig:
    """Where to read and how much to keep.

    ``max_doc_chars`` truncates single documents (a few huge files would otherwise dominate);
    ``max_domain_chars`` caps a domain's total, documents taken in a hash order; ``heldout_share``
    is the share of documents (by hash of their source) kept out of training.
    """

    stdlib_dir: Path = field(default_factory=lambda: Path(sysconfig.get_paths()["stdlib"]))
    doc_dir: Path = Path("/usr/share/doc")
    licenses_dir: Path = Path("/usr/share/common-licenses")
    man_dir: Path = Path("/usr/share/man")
    ru_root: Path | None = None  # an unpacked manpages-ru tree; None: download into scratch
    max_doc_chars: int = 60_000
    max_domain_chars: dict[str, int] = field(default_factory=lambda: {"code": 7_000_000, "en": 6_000_000,
                                                                      "ru": 9_000_000})
    max_en_man_pages: int = 1500
    heldout_share: float = 0.05
    workers: int = 2


def cyrillic_share(text: str) -> float:
    """Share of letters that are Cyrillic (0 when there are no letters)."""
    letters = len(_LETTER.findall(text))
    return len(_CYRILLIC.findall(text)) / letters if letters else 0.0


def stable_hash(s: str) -> float:
    """A number in [0, 1) from a string, the same on every machine and run."""
    return int(hashlib.sha1(s.encode()).hexdigest()[:12], 16) / 16**12


def is_heldout(source: str, share: float) -> bool:
    return stable_hash("split:" + source) < share


def clean_rendered(text: str) -> str:
    """Strip a rendered man page's indentation and justification spaces; squeeze blank lines.

    Lines that look like code (``#include``, ending in ``;`` / ``{`` / ``}``) keep single spaces
    inside like every other line, but their indentation is dropped too.
    """
    lines = [_SPACES.sub(" ", ln.strip()) for ln in text.replace("\r", "").split("\n")]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip() + "\n"


def _read_maybe_gz(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def render_man(path: Path) -> str | None:
    """Render one (possibly gzipped) man page to plain UTF-8 text; None for ``.so`` links or failures."""
    try:
        src = _read_maybe_gz(path)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if src.lstrip().startswith(b".so ") or len(src) < 200:
        return None
    try:
        res = subprocess.run(GROFF_CMD, input=src, capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0 or not res.stdout:
        return None
    return clean_rendered(res.stdout.decode("utf-8", errors="replace"))


def iter_code(cfg: CorpusConfig) -> Iterator[Document]:
    root = cfg.stdlib_dir
    if not root.is_dir():
        raise CorpusError(f"standard-library folder {root} not found")
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if set(rel.parts[:-1]) & _SKIP_STDLIB_DIRS or rel.name.startswith("test_"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) > 200:
            yield Document("code", f"stdlib/{rel}", text)


def iter_en_docs(cfg: CorpusConfig) -> Iterator[Document]:
    if cfg.licenses_dir.is_dir():
        for path in sorted(cfg.licenses_dir.iterdir()):
            if path.is_file() and not path.is_symlink():
                yield Document("en", f"licenses/{path.name}", path.read_text(errors="replace"))
    seen: set[str] = set()
    if cfg.doc_dir.is_dir():
        for path in sorted(cfg.doc_dir.rglob("*")):
            if not path.is_file() or path.is_symlink() or not _DOC_NAMES.match(path.name):
                continue
            try:
                text = _read_maybe_gz(path).decode("utf-8", errors="replace")
            except (OSError, EOFError, gzip.BadGzipFile):
                continue
            digest = hashlib.sha1(text.encode()).hexdigest()
            if digest in seen or len(text) < 200:
                continue  # many copyright files are identical
            seen.add(digest)
            yield Document("en", f"doc/{path.relative_to(cfg.doc_dir)}", text)


def _man_pages(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("man[1-8]/*") if p.is_file() and not p.is_symlink())


def render_pages(pages: list[Path], domain: str, prefix: str, root: Path, workers: int,
                 progress: Callable[[int], None] | None = None) -> Iterator[Document]:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for path, text in zip(pages, pool.map(render_man, pages)):
            if progress:
                progress(1)
            if text and len(text) > 200:
                yield Document(domain, f"{prefix}/{path.relative_to(root)}", text)


def fetch_ru_pages(scratch: Path, log: Callable[[str], None] = print) -> Path:
    """``apt-get download`` the Russian man-page packages into ``scratch`` and ``dpkg -x`` them there."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise CorpusError(f"`{tool}` not found: the Russian pages come from Debian's {' and '.join(RU_PACKAGES)}")
    debs = scratch / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_")[0] for p in debs.glob("*.deb")}
    missing = [p for p in RU_PACKAGES if p not in have]
    if missing:
        res = subprocess.run(["apt-get", "download", *missing], cwd=debs, capture_output=True, text=True)
        if res.returncode != 0:
            log("apt-get download failed; running apt-get update once and retrying")
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
            res = subprocess.run(["apt-get", "download", *missing], cwd=debs, capture_output=True, text=True)
            if res.returncode != 0:
                raise CorpusError(f"apt-get download {' '.join(missing)} failed: {res.stderr.strip()[-400:]}")
    root = scratch / "ru-root"
    root.mkdir(exist_ok=True)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    log(f"unpacked {', '.join(p.name for p in sorted(debs.glob('*.deb')))} into {root}")
    return root / "usr/share/man/ru"


def _cap(docs: Iterable[Document], cfg: CorpusConfig, domain: str) -> list[Document]:
    """Truncate long documents, then keep documents in hash order up to the domain's character cap."""
    docs = [Document(d.domain, d.source, d.text[: cfg.max_doc_chars]) for d in docs]
    docs.sort(key=lambda d: stable_hash("order:" + d.source))
    kept, total = [], 0
    for d in docs:
        if total >= cfg.max_domain_chars[domain]:
            break
        kept.append(d)
        total += len(d.text)
    return sorted(kept, key=lambda d: d.source)


def build_corpus(out: str | Path, scratch: str | Path, cfg: CorpusConfig | None = None,
                 log: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Build the corpus into ``out`` (``train.jsonl``, ``valid.jsonl``, ``corpus_meta.json``); return the meta."""
    from tqdm.auto import tqdm

    cfg = cfg or CorpusConfig()
    out, scratch = Path(out), Path(scratch)
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("groff") is None or shutil.which("preconv") is None:
        raise CorpusError("groff and preconv are needed to render man pages (Debian: apt-get install groff)")

    code = _cap(iter_code(cfg), cfg, "code")
    log(f"code: {len(code)} standard-library modules from {cfg.stdlib_dir}")

    en_pages = _man_pages(cfg.man_dir)
    en_pages.sort(key=lambda p: stable_hash("man:" + p.name))
    en_pages = sorted(en_pages[: cfg.max_en_man_pages])
    ru_dir = Path(cfg.ru_root) if cfg.ru_root else fetch_ru_pages(scratch, log)
    ru_pages = _man_pages(ru_dir)
    if not ru_pages:
        raise CorpusError(f"no Russian man pages under {ru_dir}")
    bar = tqdm(total=len(en_pages) + len(ru_pages), desc="rendering man pages", unit="page", disable=not progress)
    en = _cap([*iter_en_docs(cfg), *render_pages(en_pages, "en", "man", cfg.man_dir, cfg.workers, bar.update)],
              cfg, "en")
    ru = _cap(render_pages(ru_pages, "ru", "man-ru", ru_dir, cfg.workers, bar.update), cfg, "ru")
    bar.close()
    log(f"en: {len(en)} documents; ru: {len(ru)} documents")

    meta: dict = {"sources": {
        "code": f"Python {sysconfig.get_python_version()} standard library ({cfg.stdlib_dir}), tests excluded",
        "en": f"{cfg.licenses_dir}, README/copyright/NEWS files under {cfg.doc_dir} (deduplicated), "
              f"{len(en_pages)} English man pages from {cfg.man_dir} rendered with {' '.join(GROFF_CMD)}",
        "ru": f"Debian {' + '.join(RU_PACKAGES)} (apt-get download, dpkg -x into scratch) rendered with "
              f"{' '.join(GROFF_CMD)}; indentation and justification spaces stripped",
    }, "heldout_share": cfg.heldout_share, "max_doc_chars": cfg.max_doc_chars,
        "max_domain_chars": cfg.max_domain_chars, "splits": {}}
    for split in ("train", "valid"):
        rows = [d for d in (*code, *en, *ru) if is_heldout(d.source, cfg.heldout_share) == (split == "valid")]
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for d in rows:
                fh.write(json.dumps({"domain": d.domain, "source": d.source, "text": d.text}, ensure_ascii=False) + "\n")
        meta["splits"][split] = {dom: _stats([d for d in rows if d.domain == dom]) for dom in DOMAINS}
    for split, doms in meta["splits"].items():
        for dom, st in doms.items():
            if st["documents"] == 0:
                raise CorpusError(f"domain {dom!r} has no documents in the {split} split")
    (out / "corpus_meta.json").write_text(dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return meta


def _stats(docs: list[Document]) -> dict:
    text = "".join(d.text for d in docs)
    return {"documents": len(docs), "chars": len(text), "bytes": len(text.encode("utf-8")),
            "cyrillic_letter_share": round(cyrillic_share(text), 4)}


def read_corpus(path: str | Path, split: str) -> list[Document]:
    """Read ``<path>/<split>.jsonl`` written by :func:`build_corpus`."""
    file = Path(path) / f"{split}.jsonl"
    if not file.exists():
        raise CorpusError(f"{file} not found: build the corpus first")
    docs = []
    with open(file, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            try:
                row = json.loads(line)
                docs.append(Document(row["domain"], row["source"], row["text"]))
            except (json.JSONDecodeError, KeyError) as exc:
                raise CorpusError(f"{file} line {i}: {exc}") from exc
    return docs
