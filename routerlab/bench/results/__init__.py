"""bench report: docs/results.md written from the committed results under assets/bench (its tables' cells, the per-machine-kind table)."""
