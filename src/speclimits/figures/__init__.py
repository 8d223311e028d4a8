"""One figure, one function: results or tables in, an ``altair`` chart out, no I/O (captions and
labels live in the book's MyST). Submodules by section, re-exported: ``speclimits.figures.<name>(...)``.
"""

from speclimits.figures.trace import *  # noqa: F401,F403  (section 1: tracing)
from speclimits.figures.stats import *  # noqa: F401,F403  (sections 2-5: cost-model statistics)
from speclimits.figures.oracle import *  # noqa: F401,F403  (section 6: the Oracle)
from speclimits.figures.linguistic import *  # noqa: F401,F403  (section 7: linguistic)
from speclimits.figures.regime import *  # noqa: F401,F403  (the regime page)
