"""The parts of `python -m routerlab figures` (routerlab/figures.py): a teacher's slide figures.

    runs.py    the fresh greedy runs of the example prompts, in lockstep on the calling thread
    numbers.py what each figure shows, as plain dicts (numbers.json)
    draw.py    the five figures at slide size (the app's own figures restyled, and three new ones)
    export.py  PNG and SVG through kaleido and a Chromium

Nothing is loaded at import time.
"""
