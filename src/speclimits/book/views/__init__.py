"""Reader tables of each section, a module per area: result objects -> small frames with readable headers,
units and intervals in one cell. Nothing here fits or solves: the views select, rename, format and phrase."""
