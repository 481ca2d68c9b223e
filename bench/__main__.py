"""``python -m bench`` (see the package's docstring)."""

from bench.run import main

raise SystemExit(main())
