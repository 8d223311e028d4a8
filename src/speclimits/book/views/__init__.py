"""Reader tables of each section: result objects -> small frames with readable headers, units and
intervals in one cell (:mod:`speclimits.book.present`), one module per area, so a notebook's cell stays
one short call. Nothing here fits or solves: the views select, rename, format and phrase.
"""
