"""Entry point for `python -m koordqos`."""

from koordqos.cli import main

raise SystemExit(main())
