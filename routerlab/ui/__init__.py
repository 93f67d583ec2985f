"""The Gradio app: resources and sessions, one module per tab, and the plots (pure plotly, no torch)."""

from routerlab.ui.app import *  # noqa: F401,F403  (temporary, until the tabs are split out)
