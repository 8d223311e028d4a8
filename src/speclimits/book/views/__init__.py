"""Reader-facing tables of each section: result objects -> small frames with readable headers,
intervals in one cell and units, ready for :func:`speclimits.book.present.table`.

One module per area, so a notebook's cell stays one short call.
"""
