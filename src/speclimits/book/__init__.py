"""The book build (:mod:`~speclimits.book.build`: jupytext sources -> executed notebooks ->
static site) and its command, ``speclimits book`` (:mod:`~speclimits.book.cli`)."""

from speclimits.book.build import build_book, declared_parameters, toc_files

__all__ = ["build_book", "declared_parameters", "toc_files"]
