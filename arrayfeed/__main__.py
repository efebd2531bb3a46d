"""``python -m arrayfeed``: the command line (see :mod:`arrayfeed._cli`)."""

from ._cli import main

raise SystemExit(main())
