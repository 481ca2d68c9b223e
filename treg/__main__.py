from treg.cli import main

raise SystemExit(main())
