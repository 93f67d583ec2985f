"""`python -m routerlab.bench.load [run|serve] [options]`: runs the harness's command line (`cli.main`).

Only the entry point; the arguments and the run live in `cli.py`. The server child process that
`server.spawn` starts comes through here too (`python -m routerlab.bench.load serve --port N`).
"""

from __future__ import annotations

import sys

from routerlab.bench.load.cli import main

if __name__ == "__main__":
    sys.exit(main())
