"""`python -m engine ...`: the engine's command line, which lives in the application layer (commands/engine_cli.py).
This file is the command's name only; no module of the engine imports it (the layering test allows it alone)."""

from commands.engine_cli import main

raise SystemExit(main())
