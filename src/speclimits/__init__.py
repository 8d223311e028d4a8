"""speclimits: measure and bound speculative decoding on Mixture-of-Experts models.

The package is the source of truth; the book under ``book/`` tells the story.

Modules
-------
trace       read and write trace directories (``meta.json`` + Parquet tables)
validate    check a trace against the data contract, naming file, column and rows
costmodel   the cost-model JSON (target ``beta0(m)``, ``alpha(m)``, ``c``; draft ``a``, ``b``)
simulate    a seeded simulator that writes SIMULATED traces with a planted ground truth
figures     one function per chart, each returning an ``altair.Chart``
book        convert, execute and build the Jupyter Book
"""

from importlib.metadata import PackageNotFoundError, version

from speclimits.errors import CostModelError, SpeclimitsError, TraceFormatError

try:
    __version__ = version("speclimits")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["CostModelError", "SpeclimitsError", "TraceFormatError", "__version__"]
